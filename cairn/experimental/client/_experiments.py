"""An experiment of the SDK: its lifecycle actions, its trials and its checkpoints."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import quote

from cairn.client import Client
from cairn.errors import CairnError, UsageError
from cairn.experimental.client._checkpoints import (
    Checkpoint,
    _best_per_trial,
    _check_sort,
    _ranked,
)
from cairn.experimental.client._records import _enum, _MasterObject
from cairn.experimental.client._states import (
    TERMINAL_STATES,
    CheckpointSortBy,
    ExperimentState,
    OrderBy,
)
from cairn.experimental.client._trials import Trial


class Experiment(_MasterObject):
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
        project_id: the project it is in.
        workspace_id: that project's workspace.
    """

    def __init__(
        self, experiment_id: int, session: Client, data: Mapping[str, Any] | None = None
    ) -> None:
        self.id = int(experiment_id)
        super().__init__(session, data)

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
        self.project_id = int(data.get("project_id") or 1)
        self.workspace_id = int(data.get("workspace_id") or 1)
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

    def move_to_project(self, workspace_name: str, project_name: str) -> None:
        """Moves the experiment to project ``project_name`` of workspace ``workspace_name``.

        Raises:
            ValueError: the workspace has no such project.
        """
        projects = self._session.get(f"/workspaces/{quote(workspace_name, safe='')}/projects")
        for project in projects["projects"]:
            if project["name"] == project_name:
                self._session.post(
                    f"/experiments/{self.id}/move", {"destination_project_id": project["id"]}
                )
                self.reload()
                return
        raise ValueError(f"workspace {workspace_name!r} has no project {project_name!r}")

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
