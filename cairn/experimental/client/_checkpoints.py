"""A checkpoint of the SDK, and how lists of them are ranked (by a field or a validation
metric, best per trial)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cairn.client import Client
from cairn.errors import CairnError, UsageError
from cairn.experimental.client._records import (
    CheckpointTrainingMetadata,
    _enum,
    _MasterObject,
    _time,
)
from cairn.experimental.client._states import CheckpointSortBy, CheckpointState


class Checkpoint(_MasterObject):
    """A checkpoint a trial reported (get one with :meth:`Determined.get_checkpoint`,
    :meth:`Experiment.top_checkpoint`, :meth:`Trial.top_checkpoint`, ...).

    Attributes:
        uuid: its id (the directory's name in checkpoint storage).
        task_id: the task that saved it (the trial id, as text).
        allocation_id: the run that saved it (``"<trial_id>.<run_id>"``).
        report_time: when it was reported.
        resources: its files and their sizes.
        metadata: the metadata it was stored with (``steps_completed`` among it).
        state: :class:`CheckpointState`.
        steps_completed: the steps it was saved at.
        trial_id: the trial that saved it.
        experiment_id: that trial's experiment.
    """

    def __init__(self, session: Client, uuid: str, data: Mapping[str, Any] | None = None) -> None:
        self.uuid = uuid
        self._training: CheckpointTrainingMetadata | None = None
        super().__init__(session, data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self.trial_id = int(data.get("trial_id") or 0)
        self.experiment_id = int(data.get("experiment_id") or 0)
        run_id = int(data.get("run_id") or 0)
        self.task_id = str(self.trial_id)
        self.allocation_id = f"{self.trial_id}.{run_id}"
        self.report_time = _time(data.get("reported_at"))
        self.resources: dict[str, Any] = dict(data.get("resources") or {})
        self.metadata: dict[str, Any] = dict(data.get("metadata") or {})
        self.steps_completed = int(data.get("steps_completed") or 0)
        self.state: CheckpointState = _enum(CheckpointState, data.get("state") or "COMPLETED")
        self._training = None

    def reload(self) -> None:
        """Reads the checkpoint again from the master."""
        self._hydrate(self._session.get_checkpoint(self.uuid))

    @property
    def searcher_metric(self) -> float | None:
        """The searcher metric's value at the checkpoint's steps, if validated there."""
        value = self._data.get("searcher_metric")
        return float(value) if isinstance(value, int | float) else None

    @property
    def validation(self) -> dict[str, Any]:
        """The trial's validation metrics at the checkpoint's steps (``{}`` when none)."""
        doc = self._data.get("validation") or {}
        metrics = doc.get("metrics") if isinstance(doc, dict) else None
        return dict(metrics) if isinstance(metrics, dict) else {}

    @property
    def training(self) -> CheckpointTrainingMetadata:
        """What trained it: config, experiment, trial, hyperparameters, validation metrics (two
        reads from the master, made once)."""
        if self._training is None:
            trial = self._session.get_trial(self.trial_id)
            config = self._session.get_experiment(self.experiment_id).get("config") or {}
            self._training = CheckpointTrainingMetadata(
                experiment_config=dict(config),
                experiment_id=self.experiment_id,
                trial_id=self.trial_id,
                hparams=dict(trial.get("hparams") or {}),
                validation_metrics={"avgMetrics": self.validation} if self.validation else {},
                searcher_metric=self.searcher_metric,
            )
        return self._training

    def download(self, path: str | os.PathLike[str] | None = None, mode: Any = None) -> str:
        """Downloads the checkpoint's files into ``path`` (default ``./checkpoints/<uuid>``).

        Args:
            path: the directory to unpack into (created if needed).
            mode: accepted for Determined's SDK (:class:`DownloadMode`); cairn always downloads
                through the master.

        Returns:
            The directory, as a string.

        Raises:
            CairnError: the checkpoint is deleted, or its files could not be unpacked.
        """
        from events.domain.archive import extract_tar

        if self.state not in (CheckpointState.COMPLETED, CheckpointState.PARTIALLY_DELETED):
            raise CairnError(f"checkpoint {self.uuid} is {self.state.value}: nothing to download")
        target = Path(path) if path is not None else Path("checkpoints") / self.uuid
        data = self._session.download_checkpoint(self.uuid)
        try:
            extract_tar(data, target)
        except OSError as exc:
            raise CairnError(f"cannot unpack checkpoint {self.uuid} into {target}: {exc}") from exc
        if not (target / "metadata.json").exists():
            self.write_metadata_file(target / "metadata.json")
        return str(target)

    def write_metadata_file(self, path: str | os.PathLike[str]) -> None:
        """Writes the checkpoint's metadata as JSON to ``path``."""
        import json

        Path(path).write_text(json.dumps(self.metadata, indent=2, sort_keys=True))

    def delete(self) -> None:
        """Deletes the checkpoint (its experiment must have ended)."""
        self._session.delete_checkpoints([self.uuid])
        self.reload()

    def __repr__(self) -> str:
        return f"Checkpoint(uuid={self.uuid!r}, trial_id={self.trial_id})"


def _metric_of(checkpoint: Checkpoint, metric: str) -> float | None:
    value = checkpoint.validation.get(metric)
    return float(value) if isinstance(value, int | float) else None


def _ranked(
    checkpoints: Iterable[Checkpoint],
    sort_by: str | CheckpointSortBy,
    descending: bool,
) -> list[Checkpoint]:
    """Sorted by a field or a validation metric (checkpoints without the metric left out)."""
    items = list(checkpoints)
    if isinstance(sort_by, CheckpointSortBy):
        key = sort_by.value

        def field(c: Checkpoint) -> Any:
            value = c._data.get(key)
            return (value is None, value if value is not None else 0)

        return sorted(items, key=field, reverse=descending)
    scored = [(value, c) for c in items for value in [_metric_of(c, sort_by)] if value is not None]
    scored.sort(key=lambda pair: pair[0], reverse=descending)
    return [c for _, c in scored]


def _best_per_trial(checkpoints: Sequence[Checkpoint], limit: int) -> list[Checkpoint]:
    seen: set[int] = set()
    out: list[Checkpoint] = []
    for checkpoint in checkpoints:
        if checkpoint.trial_id not in seen:
            seen.add(checkpoint.trial_id)
            out.append(checkpoint)
        if len(out) == limit:
            break
    return out


def _check_sort(sort_by: str | None, smaller_is_better: bool | None) -> None:
    if (sort_by is None) != (smaller_is_better is None):
        raise UsageError("sort_by and smaller_is_better go together")
