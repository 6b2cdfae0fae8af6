"""A trial of the SDK: its logs, metrics and checkpoints."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cairn.client import Client
from cairn.errors import CairnError, UsageError
from cairn.experimental.client._checkpoints import Checkpoint, _check_sort, _ranked
from cairn.experimental.client._records import TrialMetrics, _enum, _MasterObject, _time
from cairn.experimental.client._states import CheckpointSortBy, OrderBy, TrialState

if TYPE_CHECKING:
    from cairn.experimental.client._experiments import Experiment

_PAGE = 1000


class Trial(_MasterObject):
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
        super().__init__(session, data)

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
        from cairn.experimental.client._experiments import Experiment

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
