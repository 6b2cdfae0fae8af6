"""The Python SDK, in the shape of Determined's ``determined.experimental.client``.

Drive experiments from a program instead of the CLI::

    from cairn.experimental import client

    client.login()  # optional: master and credentials as the CLI finds them
    exp = client.create_experiment("const.yaml", "./code")
    state = exp.wait(interval=1.0)  # ExperimentState.COMPLETED
    best = exp.top_checkpoint()
    path = best.download("./best")
    for point in exp.list_trials()[0].iter_metrics("validation"):
        print(point.steps_completed, point.metrics)

The module functions use one :class:`Determined` made on first use (or by :func:`login`); a
program talking to several masters makes a :class:`Determined` for each. The master and the
credentials are found as the CLI finds them (:mod:`cairn.auth`): ``login()``'s arguments, else
``CAIRN_MASTER``/``DET_MASTER`` and ``CAIRN_USER``/``CAIRN_PASSWORD`` or ``DET_USER``/``DET_PASS``,
else the token ``cairn user login`` stored, else the embedded cluster (``cairn up``) as its admin.

Everything goes through the REST API at ``/api/v1`` (:class:`cairn.client.Client`, the one HTTP
client cairn has); errors are :class:`cairn.errors.CairnError`\\ s (an
:class:`~cairn.client.ApiError` carries the HTTP status). ``docs/sdk.md`` lists what is here and
what of Determined's SDK is not.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from cairn.auth import session
from cairn.client import Client
from cairn.errors import CairnError, UsageError

log = logging.getLogger("cairn.client")

_PAGE = 1000


class OrderBy(enum.Enum):
    """Sort direction (``ASC``/``DESC`` are aliases)."""

    ASCENDING = "asc"
    DESCENDING = "desc"
    ASC = "asc"
    DESC = "desc"


_STATES = (
    "ACTIVE",
    "PAUSED",
    "STOPPING_COMPLETED",
    "STOPPING_CANCELED",
    "STOPPING_KILLED",
    "STOPPING_ERROR",
    "COMPLETED",
    "CANCELED",
    "ERROR",
    "DELETING",
    "DELETED",
    "DELETE_FAILED",
)


class ExperimentState(enum.Enum):
    """An experiment's state (Determined's names)."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"
    DELETING = "DELETING"
    DELETED = "DELETED"
    DELETE_FAILED = "DELETE_FAILED"


class TrialState(enum.Enum):
    """A trial's state (Determined's names)."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"
    DELETING = "DELETING"
    DELETED = "DELETED"
    DELETE_FAILED = "DELETE_FAILED"


TERMINAL_STATES = frozenset(
    {
        ExperimentState.COMPLETED,
        ExperimentState.CANCELED,
        ExperimentState.ERROR,
        ExperimentState.DELETED,
        ExperimentState.DELETE_FAILED,
    }
)
"""The states :meth:`Experiment.wait` returns at."""


class CheckpointState(enum.Enum):
    """A checkpoint's state."""

    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    DELETED = "DELETED"
    PARTIALLY_DELETED = "PARTIALLY_DELETED"


class CheckpointSortBy(enum.Enum):
    """Fields checkpoints can be sorted by (besides a validation metric's name)."""

    UUID = "uuid"
    TRIAL_ID = "trial_id"
    BATCH_NUMBER = "steps_completed"
    END_TIME = "reported_at"
    STATE = "state"
    SEARCHER_METRIC = "searcher_metric"


class DownloadMode(enum.Enum):
    """How :meth:`Checkpoint.download` fetches files; cairn always goes through the master, so
    every mode behaves as ``MASTER``."""

    DIRECT = "direct"
    MASTER = "master"
    AUTO = "auto"


def _enum(kind: type[enum.Enum], value: Any) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise CairnError(f"the master answered an unknown {kind.__name__}: {value!r}") from None


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


@dataclass(frozen=True)
class TrialMetrics:
    """One reported point of a trial's metrics.

    Attributes:
        trial_id: the trial.
        trial_run_id: the run (1, 2, ... one per restart) that reported it.
        steps_completed: the steps the point was reported at.
        end_time: when it was reported.
        metrics: the reported values.
        batch_metrics: per-batch values (cairn keeps none: always ``None``).
        group: ``"training"``, ``"validation"``, or a custom group.
    """

    trial_id: int
    trial_run_id: int
    steps_completed: int
    end_time: datetime | None
    metrics: dict[str, Any]
    batch_metrics: list[dict[str, Any]] | None
    group: str


@dataclass(frozen=True)
class CheckpointTrainingMetadata:
    """What trained a checkpoint.

    Attributes:
        experiment_config: the experiment's config.
        experiment_id: the experiment.
        trial_id: the trial.
        hparams: the trial's hyperparameters.
        validation_metrics: the trial's validation at the checkpoint's steps
            (``{"avgMetrics": {...}}`` as Determined shapes it; ``{}`` when none).
        searcher_metric: the searcher metric's value there, if any.
    """

    experiment_config: dict[str, Any]
    experiment_id: int
    trial_id: int
    hparams: dict[str, Any]
    validation_metrics: dict[str, Any]
    searcher_metric: float | None


@dataclass(frozen=True)
class User:
    """A user of the master."""

    username: str
    admin: bool
    active: bool = True


@dataclass(frozen=True)
class Agent:
    """An agent of the cluster.

    Attributes:
        agent_id: the agent's id.
        state: its state as the scheduler sees it.
        enabled: whether work may be placed on it.
        resource_pool: its pool.
        hostname: where it runs.
        slots: its slots' ids.
        busy_slots: how many of them hold an allocation.
    """

    agent_id: str
    state: str
    enabled: bool
    resource_pool: str | None
    hostname: str | None
    slots: list[str]
    busy_slots: int


class Checkpoint:
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
        self._session = session
        self.uuid = uuid
        self._training: CheckpointTrainingMetadata | None = None
        if data is None:
            self.reload()
        else:
            self._hydrate(data)

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


class Trial:
    """One trial (get one with :meth:`Determined.get_trial` or :meth:`Experiment.list_trials`).

    Attributes:
        id: the trial's cluster-wide id.
        experiment_id: its experiment.
        hparams: its hyperparameters.
        state: :class:`TrialState`.
        steps_completed: the steps it has reported.
        restarts: how often it restarted.
        summary_metrics: ``{"best_metric": ..., "latest_validation": {...}}``.
    """

    def __init__(
        self, trial_id: int, session: Client, data: Mapping[str, Any] | None = None
    ) -> None:
        self.id = int(trial_id)
        self._session = session
        if data is None:
            self.reload()
        else:
            self._hydrate(data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        self.experiment_id = int(data.get("experiment_id") or 0)
        self.hparams: dict[str, Any] = dict(data.get("hparams") or {})
        self.state: TrialState = _enum(TrialState, data.get("state") or "ACTIVE")
        self.steps_completed = int(data.get("steps_completed") or 0)
        self.restarts = int(data.get("restarts") or 0)
        self.summary_metrics: dict[str, Any] = {
            "best_metric": data.get("best_metric"),
            "latest_validation": data.get("latest_validation"),
        }

    def reload(self) -> None:
        """Reads the trial again from the master."""
        self._hydrate(self._session.get_trial(self.id))

    def kill(self) -> None:
        """Kills the trial (it ends CANCELED)."""
        self._session.kill_trial(self.id)

    def get_experiment(self) -> Experiment:
        """The trial's experiment."""
        return Experiment(self.experiment_id, self._session)

    def iter_logs(
        self, follow: bool = False, *, head: int | None = None, tail: int | None = None
    ) -> Iterator[str]:
        """The trial's log lines (each ending with a newline).

        Args:
            follow: keep yielding lines as they are written until the trial ends.
            head: only the first ``head`` lines.
            tail: only the last ``tail`` lines (where following starts).
        """
        count = 0
        if follow:
            query = {"tail": tail} if tail is not None else {}
            for entry in self._session.follow_trial_logs(self.id, **query):
                if head is not None and count >= head:
                    return
                count += 1
                yield f"{entry.get('line', '')}\n"
            return
        if tail is not None:
            entries = list(self._session.trial_logs(self.id, tail=tail).get("logs") or [])
        else:
            entries, after = [], 0
            while True:
                page = self._session.trial_logs(self.id, after_id=after, limit=_PAGE)
                batch = list(page.get("logs") or [])
                entries.extend(batch)
                next_id = page.get("next_after_id")
                if len(batch) < _PAGE or not isinstance(next_id, int) or next_id <= after:
                    break
                if head is not None and len(entries) >= head:
                    break
                after = next_id
        for entry in entries[:head] if head is not None else entries:
            yield f"{entry.get('line', '')}\n"

    def logs(
        self, follow: bool = False, *, head: int | None = None, tail: int | None = None
    ) -> Iterator[str]:
        """Same as :meth:`iter_logs` (Determined's earlier name)."""
        return self.iter_logs(follow, head=head, tail=tail)

    def iter_metrics(self, group: str) -> Iterator[TrialMetrics]:
        """The trial's reported points of one metric group, in steps order.

        Args:
            group: ``"training"``, ``"validation"``, or a custom group (``"system"`` for the
                profiler's samples).
        """
        answer = self._session.get(f"/trials/{self.id}/metrics", group=group)
        for row in answer.get("metrics") or []:
            yield TrialMetrics(
                trial_id=self.id,
                trial_run_id=int(row.get("run_id") or 0),
                steps_completed=int(row.get("steps_completed") or 0),
                end_time=_time(row.get("reported_at")),
                metrics=dict(row.get("metrics") or {}),
                batch_metrics=None,
                group=str(row.get("group") or group),
            )

    def stream_training_metrics(self) -> Iterator[TrialMetrics]:
        """``iter_metrics("training")`` (Determined's earlier name)."""
        return self.iter_metrics("training")

    def stream_validation_metrics(self) -> Iterator[TrialMetrics]:
        """``iter_metrics("validation")`` (Determined's earlier name)."""
        return self.iter_metrics("validation")

    def _checkpoints(self) -> list[Checkpoint]:
        detail = self._session.get_trial(self.id)
        self._hydrate(detail)
        return [
            Checkpoint(self._session, str(c["uuid"]), c)
            for c in detail.get("checkpoints") or []
            if c.get("state") == "COMPLETED"
        ]

    def list_checkpoints(
        self,
        sort_by: str | CheckpointSortBy | None = None,
        order_by: OrderBy | None = None,
        max_results: int | None = None,
    ) -> list[Checkpoint]:
        """The trial's completed checkpoints; by default best first by the searcher metric
        (then the most steps first). ``sort_by`` (a validation metric's name, or a
        :class:`CheckpointSortBy`) and ``order_by`` go together."""
        if (sort_by is None) != (order_by is None):
            raise UsageError("sort_by and order_by go together")
        found = self._checkpoints()
        if sort_by is None or order_by is None:
            smaller = self.get_experiment()._smaller_is_better
            found.sort(key=lambda c: -c.steps_completed)
            with_metric = [c for c in found if c.searcher_metric is not None]
            with_metric.sort(key=lambda c: float(c.searcher_metric or 0) * (1 if smaller else -1))
            found = with_metric + [c for c in found if c.searcher_metric is None]
        else:
            found = _ranked(found, sort_by, order_by in (OrderBy.DESCENDING, OrderBy.DESC))
        return found[:max_results] if max_results is not None else found

    def select_checkpoint(
        self,
        latest: bool = False,
        best: bool = False,
        uuid: str | None = None,
        sort_by: str | None = None,
        smaller_is_better: bool | None = None,
    ) -> Checkpoint | None:
        """One checkpoint of the trial: the ``latest`` (most steps), the ``best`` (by the
        searcher metric, or ``sort_by``), or the one with ``uuid``; exactly one of the three.

        Returns:
            The checkpoint, or ``None`` when the trial has none that fits.
        """
        if sum([latest, best, uuid is not None]) != 1:
            raise UsageError("choose exactly one of latest, best and uuid")
        _check_sort(sort_by, smaller_is_better)
        found = self._checkpoints()
        if uuid is not None:
            return next((c for c in found if c.uuid == uuid), None)
        if latest:
            return max(found, key=lambda c: c.steps_completed, default=None)
        if sort_by is not None:
            ranked = _ranked(found, sort_by, not smaller_is_better)
        else:
            ranked = self.list_checkpoints()
        return ranked[0] if ranked else None

    def top_checkpoint(
        self, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> Checkpoint:
        """The trial's best checkpoint (by the searcher metric, or ``sort_by``).

        Raises:
            CairnError: the trial has no checkpoint.
        """
        found = self.select_checkpoint(
            best=True, sort_by=sort_by, smaller_is_better=smaller_is_better
        )
        if found is None:
            raise CairnError(f"trial {self.id} has no completed checkpoint")
        return found

    def __repr__(self) -> str:
        return f"Trial(id={self.id}, experiment_id={self.experiment_id})"


class Experiment:
    """One experiment (get one with :meth:`Determined.get_experiment` or
    :meth:`Determined.create_experiment`).

    Attributes:
        id: the experiment's id.
        name: its name.
        description: its description.
        state: :class:`ExperimentState` (as of the last :meth:`reload`).
        config: its config (with every later change applied).
        labels: its labels.
        archived: whether it is archived.
        progress: 0..1, or ``None``.
        owner: the user who submitted it.
    """

    def __init__(
        self, experiment_id: int, session: Client, data: Mapping[str, Any] | None = None
    ) -> None:
        self.id = int(experiment_id)
        self._session = session
        if data is None:
            self.reload()
        else:
            self._hydrate(data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        self.config: dict[str, Any] = dict(data.get("config") or {})
        self.name = data.get("name") or self.config.get("name")
        self.description = data.get("description")
        self.state: ExperimentState = _enum(ExperimentState, data.get("state") or "ACTIVE")
        self.labels: set[str] = {str(label) for label in data.get("labels") or []}
        self.archived = bool(data.get("archived"))
        progress = data.get("progress")
        self.progress = float(progress) if isinstance(progress, int | float) else None
        self.owner = data.get("owner")
        self._trials = [dict(t) for t in data.get("trials") or []]

    @property
    def _smaller_is_better(self) -> bool:
        searcher = self.config.get("searcher") or {}
        return bool(searcher.get("smaller_is_better", True))

    def reload(self) -> None:
        """Reads the experiment again from the master."""
        self._hydrate(self._session.get_experiment(self.id))

    def get_config(self) -> dict[str, Any]:
        """The experiment's config, read again from the master."""
        self.reload()
        return self.config

    def _act(self, action: str) -> None:
        self._session.experiment_action(self.id, action)
        self.reload()

    def activate(self) -> None:
        """Activates (unpauses) the experiment."""
        self._act("activate")

    def pause(self) -> None:
        """Pauses the experiment (its trials checkpoint and stop)."""
        self._act("pause")

    def cancel(self) -> None:
        """Cancels the experiment (its trials checkpoint and stop for good)."""
        self._act("cancel")

    def kill(self) -> None:
        """Kills the experiment at once."""
        self._act("kill")

    def archive(self) -> None:
        """Hides the ended experiment from lists."""
        self._act("archive")

    def unarchive(self) -> None:
        """Shows the archived experiment in lists again."""
        self._act("unarchive")

    def delete(self) -> None:
        """Starts deleting the ended experiment and its checkpoints."""
        self._session.delete_experiment(self.id)

    def set_name(self, name: str) -> None:
        """Renames the experiment."""
        self._session.patch_experiment(self.id, {"name": name})
        self.reload()

    def set_description(self, description: str) -> None:
        """Sets the experiment's description."""
        self._session.patch_experiment(self.id, {"description": description})
        self.reload()

    def add_label(self, label: str) -> None:
        """Adds a label."""
        self._session.patch_experiment(self.id, {"add_labels": [label]})
        self.reload()

    def remove_label(self, label: str) -> None:
        """Removes a label."""
        self._session.patch_experiment(self.id, {"remove_labels": [label]})
        self.reload()

    def set_labels(self, labels: Iterable[str]) -> None:
        """Makes ``labels`` the experiment's labels."""
        wanted = {str(label) for label in labels}
        self.reload()
        changes: dict[str, Any] = {}
        if wanted - self.labels:
            changes["add_labels"] = sorted(wanted - self.labels)
        if self.labels - wanted:
            changes["remove_labels"] = sorted(self.labels - wanted)
        if changes:
            self._session.patch_experiment(self.id, changes)
            self.reload()

    def wait(self, interval: float = 5.0) -> ExperimentState:
        """Waits until the experiment has ended.

        Args:
            interval: seconds between checks.

        Returns:
            The state it ended in (COMPLETED, CANCELED, ERROR, or a deleted state).

        Raises:
            ValueError: the experiment is paused (it would never end).
        """
        waited = 0.0
        while True:
            self.reload()
            if self.state in TERMINAL_STATES:
                return self.state
            if self.state == ExperimentState.PAUSED:
                raise ValueError(f"experiment {self.id} is paused: activate it first")
            time.sleep(interval)
            waited += interval
            if int(waited) // 60 != int(waited - interval) // 60:
                print(
                    f"waiting for experiment {self.id} to end ({waited / 60:.0f} min)",
                    file=sys.stderr,
                )

    def await_first_trial(self, interval: float = 0.1) -> Trial:
        """Waits until the experiment has a trial and returns it.

        Raises:
            RuntimeError: the experiment ended without any trial.
        """
        while True:
            self.reload()
            if self._trials:
                first = min(self._trials, key=lambda t: (t.get("seq") or 0, t["trial_id"]))
                return Trial(int(first["trial_id"]), self._session, first)
            if self.state in TERMINAL_STATES:
                raise RuntimeError(f"experiment {self.id} ended ({self.state.value}) with no trial")
            time.sleep(interval)

    def iter_trials(
        self, sort_by: Any = None, order_by: OrderBy | None = None, *, limit: int | None = None
    ) -> Iterator[Trial]:
        """The experiment's trials, by id (``order_by=OrderBy.DESCENDING``: newest first)."""
        rows = self._session.list_trials(self.id)["trials"]
        rows.sort(
            key=lambda t: t["trial_id"], reverse=order_by in (OrderBy.DESC, OrderBy.DESCENDING)
        )
        for row in rows[:limit] if limit is not None else rows:
            yield Trial(int(row["trial_id"]), self._session, row)

    def list_trials(self, sort_by: Any = None, order_by: OrderBy | None = None) -> list[Trial]:
        """The experiment's trials, by id."""
        return list(self.iter_trials(sort_by, order_by))

    def get_trials(self, sort_by: Any = None, order_by: OrderBy | None = None) -> list[Trial]:
        """Same as :meth:`list_trials` (Determined's earlier name)."""
        return self.list_trials(sort_by, order_by)

    def list_checkpoints(
        self,
        sort_by: str | CheckpointSortBy | None = None,
        order_by: OrderBy | None = None,
        max_results: int | None = None,
    ) -> list[Checkpoint]:
        """The experiment's completed checkpoints; by default best first by the searcher
        metric. ``sort_by`` (a validation metric's name, or a :class:`CheckpointSortBy`) and
        ``order_by`` go together."""
        if (sort_by is None) != (order_by is None):
            raise UsageError("sort_by and order_by go together")
        if sort_by is None or order_by is None:
            rows = self._session.list_checkpoints(self.id, limit=max_results, sort_by="metric")
            return [Checkpoint(self._session, str(c["uuid"]), c) for c in rows["checkpoints"]]
        rows = self._session.list_checkpoints(self.id, sort_by="steps")
        found = [Checkpoint(self._session, str(c["uuid"]), c) for c in rows["checkpoints"]]
        ranked = _ranked(found, sort_by, order_by in (OrderBy.DESCENDING, OrderBy.DESC))
        return ranked[:max_results] if max_results is not None else ranked

    def top_n_checkpoints(
        self, limit: int, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> list[Checkpoint]:
        """The best checkpoint of each of the ``limit`` best trials, best first (by the
        searcher metric, or validation metric ``sort_by``)."""
        _check_sort(sort_by, smaller_is_better)
        if sort_by is None:
            ranked = self.list_checkpoints()
        else:
            ranked = self.list_checkpoints(
                sort_by, OrderBy.ASCENDING if smaller_is_better else OrderBy.DESCENDING
            )
        return _best_per_trial(ranked, limit)

    def top_checkpoint(
        self, sort_by: str | None = None, smaller_is_better: bool | None = None
    ) -> Checkpoint:
        """The experiment's best checkpoint.

        Raises:
            CairnError: the experiment has no completed checkpoint (with that metric).
        """
        best = self.top_n_checkpoints(1, sort_by=sort_by, smaller_is_better=smaller_is_better)
        if not best:
            raise CairnError(f"experiment {self.id} has no completed checkpoint")
        return best[0]

    def __repr__(self) -> str:
        return f"Experiment(id={self.id})"


def _read_config(config: str | os.PathLike[str] | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    path = Path(config)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the config {path}: {exc.strerror or exc}") from None


class Determined:
    """A connection to one master: everything the module functions do, for that master.

    Args:
        master: the master's address (default: ``CAIRN_MASTER``, ``DET_MASTER``, the embedded
            cluster, ``localhost:8080``).
        user: log in as this user.
        password: ``user``'s password (default: ``CAIRN_PASSWORD``/``DET_PASS``, else asked on a
            terminal).
        cert_path: not supported (cairn uses the system's certificate store).
        cert_name: not supported.
        noverify: not supported.

    Raises:
        UsageError: a certificate setting was given.
        AuthRequiredError: the credentials were refused, or none could be had.
    """

    def __init__(
        self,
        master: str | None = None,
        user: str | None = None,
        password: str | None = None,
        cert_path: str | None = None,
        cert_name: str | None = None,
        noverify: bool = False,
    ) -> None:
        if cert_path is not None or cert_name is not None or noverify:
            raise UsageError("cert_path, cert_name and noverify are not supported by cairn")
        self._session = session(master, user, password)

    @property
    def master(self) -> str:
        """The master's URL."""
        return self._session.master

    def create_experiment(
        self,
        config: str | os.PathLike[str] | Mapping[str, Any],
        model_dir: str | os.PathLike[str] | None = None,
        includes: Iterable[str | os.PathLike[str]] | None = None,
        project_id: int | None = None,
        template: str | None = None,
    ) -> Experiment:
        """Submits an experiment and activates it.

        Args:
            config: the config: a YAML file's path, or a mapping.
            model_dir: the code directory (``None``: no code; the entrypoint is in the image).
            includes: files or directories added to the code under their own names.
            project_id: accepted for Determined's SDK; cairn has no projects.
            template: a template the config is merged over.

        Returns:
            The experiment.

        Raises:
            UsageError: the config file cannot be read.
            ApiError: the master refused the config (``errors`` lists every problem).
        """
        if project_id is not None:
            log.warning("project_id ignored: cairn has no projects")
        answer = self._session.submit_experiment(
            _read_config(config),
            Path(model_dir) if model_dir is not None else None,
            template=template,
            includes=[Path(p) for p in includes or ()],
        )
        for warning in answer.get("warnings") or []:
            log.warning("config %s: %s", warning.get("path"), warning.get("message"))
        return Experiment(int(answer["id"]), self._session)

    def get_experiment(self, experiment_id: int) -> Experiment:
        """One experiment.

        Raises:
            ApiError: no such experiment (status 404), or not yours to read.
        """
        return Experiment(experiment_id, self._session)

    def list_experiments(
        self,
        sort_by: Any = None,
        order_by: OrderBy | None = None,
        experiment_ids: Sequence[int] | None = None,
        labels: Sequence[str] | None = None,
        users: Sequence[str] | None = None,
        states: Sequence[ExperimentState] | None = None,
        name: str | None = None,
        project_id: int | None = None,
    ) -> list[Experiment]:
        """The experiments you may read (archived ones too), newest first, filtered by ids,
        labels (all of them), owners, states and a substring of the name."""
        owner = users[0] if users is not None and len(users) == 1 else None
        state = ",".join(s.value for s in states) if states else None
        rows = self._session.list_experiments(
            archived="all",
            owner=owner,
            state=state,
            name=name,
            order_by="id" if order_by in (OrderBy.ASC, OrderBy.ASCENDING) else None,
        )["experiments"]
        out = []
        for row in rows:
            if experiment_ids is not None and row["id"] not in set(experiment_ids):
                continue
            if users is not None and row.get("owner") not in set(users):
                continue
            experiment = Experiment(int(row["id"]), self._session, row)
            if labels and not set(labels) <= experiment.labels:
                experiment.reload()  # a list row has no labels
                if not set(labels) <= experiment.labels:
                    continue
            out.append(experiment)
        return out

    def get_trial(self, trial_id: int) -> Trial:
        """One trial."""
        return Trial(trial_id, self._session)

    def get_checkpoint(self, uuid: str) -> Checkpoint:
        """One checkpoint."""
        return Checkpoint(self._session, uuid)

    def iter_trials_metrics(
        self, trial_ids: Sequence[int], group: str = "training"
    ) -> Iterator[TrialMetrics]:
        """The points of one metric group of several trials, trial by trial."""
        for trial_id in trial_ids:
            yield from Trial(trial_id, self._session, {}).iter_metrics(group)

    def list_agents(self) -> list[Agent]:
        """The cluster's agents."""
        agents = []
        for row in self._session.list_agents()["agents"]:
            slots = row.get("slots") or []
            agents.append(
                Agent(
                    agent_id=str(row.get("agent_id")),
                    state=str(row.get("state")),
                    enabled=bool(row.get("enabled")),
                    resource_pool=row.get("resource_pool"),
                    hostname=row.get("hostname"),
                    slots=[str(s.get("slot_id")) for s in slots],
                    busy_slots=sum(1 for s in slots if s.get("allocation_id")),
                )
            )
        return agents

    def whoami(self) -> User:
        """The user this connection acts as."""
        me = self._session.me()
        return User(username=str(me.get("username")), admin=bool(me.get("admin")))

    def get_session_username(self) -> str:
        """The name of the user this connection acts as."""
        return self.whoami().username

    def list_users(self, active: bool | None = None) -> list[User]:
        """Every user (admins only), or only the active (or inactive) ones."""
        users = [
            User(
                username=str(u.get("username")),
                admin=bool(u.get("admin")),
                active=bool(u.get("active", True)),
            )
            for u in self._session.list_users()["users"]
        ]
        return [u for u in users if active is None or u.active == active]

    def create_user(
        self, username: str, admin: bool, password: str | None = None, remote: bool = False
    ) -> User:
        """Creates a user (admins only)."""
        if remote:
            raise UsageError("remote users (an external identity provider) are not supported")
        if password is None:
            raise UsageError("a password is required")
        made = self._session.create_user(username, password, admin=admin)
        return User(username=str(made.get("username", username)), admin=bool(made.get("admin")))

    def logout(self) -> None:
        """Revokes this connection's token."""
        self._session.logout()


_determined: Determined | None = None


def login(
    master: str | None = None,
    user: str | None = None,
    password: str | None = None,
    cert_path: str | None = None,
    cert_name: str | None = None,
    noverify: bool = False,
) -> None:
    """Connects the module functions to a master (see :class:`Determined` for the arguments).

    Optional: the first module function called logs in with the defaults. Call it once,
    before any other.

    Raises:
        ValueError: the module is connected already.
    """
    global _determined
    if _determined is not None:
        raise ValueError("login() was called already (or another function logged in first)")
    _determined = Determined(master, user, password, cert_path, cert_name, noverify)


def _client() -> Determined:
    global _determined
    if _determined is None:
        _determined = Determined()
    return _determined


def create_experiment(
    config: str | os.PathLike[str] | Mapping[str, Any],
    model_dir: str | os.PathLike[str] | None = None,
    includes: Iterable[str | os.PathLike[str]] | None = None,
    project_id: int | None = None,
    template: str | None = None,
) -> Experiment:
    """Submits an experiment (see :meth:`Determined.create_experiment`)."""
    return _client().create_experiment(config, model_dir, includes, project_id, template)


def get_experiment(experiment_id: int) -> Experiment:
    """One experiment (see :meth:`Determined.get_experiment`)."""
    return _client().get_experiment(experiment_id)


def list_experiments(
    sort_by: Any = None,
    order_by: OrderBy | None = None,
    experiment_ids: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    users: Sequence[str] | None = None,
    states: Sequence[ExperimentState] | None = None,
    name: str | None = None,
    project_id: int | None = None,
) -> list[Experiment]:
    """Experiments (see :meth:`Determined.list_experiments`)."""
    return _client().list_experiments(
        sort_by, order_by, experiment_ids, labels, users, states, name, project_id
    )


def get_trial(trial_id: int) -> Trial:
    """One trial."""
    return _client().get_trial(trial_id)


def get_checkpoint(uuid: str) -> Checkpoint:
    """One checkpoint."""
    return _client().get_checkpoint(uuid)


def iter_trials_metrics(
    trial_ids: Sequence[int], group: str = "training"
) -> Iterator[TrialMetrics]:
    """The points of one metric group of several trials."""
    return _client().iter_trials_metrics(trial_ids, group)


def list_agents() -> list[Agent]:
    """The cluster's agents."""
    return _client().list_agents()


def whoami() -> User:
    """The user the module acts as."""
    return _client().whoami()


def get_session_username() -> str:
    """The name of the user the module acts as."""
    return _client().get_session_username()


def list_users(active: bool | None = None) -> list[User]:
    """Users (admins only)."""
    return _client().list_users(active)


def create_user(
    username: str, admin: bool, password: str | None = None, remote: bool = False
) -> User:
    """Creates a user (admins only)."""
    return _client().create_user(username, admin, password, remote)


def logout() -> None:
    """Revokes the module's token and forgets the connection."""
    global _determined
    if _determined is not None:
        _determined.logout()
    _determined = None


__all__ = [
    "Agent",
    "Checkpoint",
    "CheckpointSortBy",
    "CheckpointState",
    "CheckpointTrainingMetadata",
    "Determined",
    "DownloadMode",
    "Experiment",
    "ExperimentState",
    "OrderBy",
    "Trial",
    "TrialMetrics",
    "TrialState",
    "User",
    "create_experiment",
    "create_user",
    "get_checkpoint",
    "get_experiment",
    "get_session_username",
    "get_trial",
    "iter_trials_metrics",
    "list_agents",
    "list_experiments",
    "list_users",
    "login",
    "logout",
    "whoami",
]
