"""The legacy searcher-operations API (mirrors ``det.core.SearcherContext`` up to 0.37).

Scripts written against it loop ``for op in ctx.searcher.operations():``, train until
``op.length``, then call ``op.report_completed(metric)``. cairn's searchers stop trials rather
than hand out further lengths, so a trial gets at most one operation: its searcher length (the
config's ``searcher.max_time``, else ``searcher.max_length``). Before handing it out the chief asks
the cluster (``GET /api/v1/trials/{trial_id}/searcher/operation``); once the searcher has asked
the trial to stop (ASHA), there is no operation left, and ``operations()`` ends at once.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

from cairn.core._distributed import DistributedContext
from cairn.core._http import Session
from cairn.core._train import TrainContext

log = logging.getLogger("cairn.core")


class Unit(enum.Enum):
    """The unit of the configured searcher length."""

    EPOCHS = "EPOCHS"
    RECORDS = "RECORDS"
    BATCHES = "BATCHES"


class SearcherMode(enum.Enum):
    """Which ranks iterate :meth:`SearcherContext.operations`.

    Attributes:
        WorkersAskChief: every rank iterates in step; the chief broadcasts each operation.
        ChiefOnly: only the chief iterates (it tells the workers itself).
    """

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"


_UNITS = {"batches": Unit.BATCHES, "records": Unit.RECORDS, "epochs": Unit.EPOCHS}


def configured_units(config: Mapping[str, Any]) -> Unit | None:
    """The unit of ``searcher.max_length`` (``None`` for a bare number or no length)."""
    searcher = config.get("searcher")
    length = searcher.get("max_length") if isinstance(searcher, Mapping) else None
    if isinstance(length, Mapping):  # stored configs list every unit, the unused ones null
        given = [unit for unit, count in length.items() if count is not None]
        return _UNITS.get(str(given[0])) if len(given) == 1 else None
    return None


class SearcherOperation:
    """One train-validate-report cycle: train until :attr:`length`, then report the metric.

    Args:
        train: where progress and the searcher metric are reported.
        length: the absolute amount of training (in the configured units) to reach.
        is_chief: only the chief reports.
        metric: the searcher's metric name (``None`` off-cluster).
    """

    def __init__(
        self, train: TrainContext, length: int, *, is_chief: bool, metric: str | None = None
    ) -> None:
        self._train = train
        self._length = length
        self._is_chief = is_chief
        self._metric = metric
        self._completed = False

    @property
    def length(self) -> int:
        """The total training (not an increment) to reach before validating."""
        return self._length

    @property
    def completed(self) -> bool:
        """Whether :meth:`report_completed` was called."""
        return self._completed

    def report_progress(self, length: float) -> None:
        """Reports how far training got, in the units of :attr:`length` (shown as progress).

        Raises:
            RuntimeError: called on a worker, or after :meth:`report_completed`.
        """
        if not self._is_chief:
            raise RuntimeError("op.report_progress() may only be called on the chief")
        if self._completed and length != self._length:
            raise RuntimeError("op.report_progress() was called after op.report_completed()")
        fraction = float(length) / self._length if self._length > 0 else 1.0
        self._train.report_progress(min(max(fraction, 0.0), 1.0))

    def report_completed(self, searcher_metric: Any) -> None:
        """Ends the operation with the value of the searcher's metric.

        The searcher decides from validation reports; when the trial has not reported
        ``searcher_metric``'s name at :attr:`length` steps, it is reported as validation there.

        Raises:
            RuntimeError: called on a worker, or twice.
        """
        if not self._is_chief:
            raise RuntimeError("op.report_completed() may only be called on the chief")
        if self._completed:
            raise RuntimeError("op.report_completed() may only be called once")
        self._completed = True
        log.info(
            "cairn: searcher operation of length %d completed: %r", self._length, searcher_metric
        )
        if self._metric is None:
            return
        try:
            value = float(searcher_metric)
        except (TypeError, ValueError):
            log.warning("cairn: searcher metric %r is not a number; not reported", searcher_metric)
            return
        if math.isfinite(value) and not self._train.validated(self._length, self._metric):
            self._train.report_validation_metrics(self._length, {self._metric: value})


class SearcherContext:
    """Hands out the trial's searcher operations (see the module docstring).

    Args:
        train: the trial's :class:`TrainContext`.
        distributed: this process's rank.
        config: the experiment config (its ``searcher`` section gives the length and metric).
        session: the HTTP session to ask the cluster, or ``None`` off-cluster (one operation of
            length 1, as Determined's stand-in gives).
        trial_id: the trial whose operation is asked for.
    """

    def __init__(
        self,
        train: TrainContext,
        distributed: DistributedContext,
        config: Mapping[str, Any],
        *,
        session: Session | None = None,
        trial_id: int = 0,
    ) -> None:
        self._train = train
        self._distributed = distributed
        self._config = dict(config)
        self._session = session
        self._trial_id = trial_id
        searcher = self._config.get("searcher")
        metric = searcher.get("metric") if isinstance(searcher, Mapping) else None
        self._metric = str(metric) if metric and session is not None else None

    def _next_length(self, done: bool) -> int | None:
        """The chief's next operation length, or ``None`` when there is none."""
        if self._session is None:
            return None if done else 1
        if done:
            return None
        answer = self._session.request("GET", f"/trials/{self._trial_id}/searcher/operation")
        if not isinstance(answer, dict) or answer.get("completed") or answer.get("length") is None:
            return None
        return int(answer["length"])

    def operations(
        self,
        searcher_mode: SearcherMode = SearcherMode.WorkersAskChief,
        auto_ack: bool = True,
    ) -> Iterator[SearcherOperation]:
        """Yields the trial's operations; the chief must ``report_completed()`` each one.

        Args:
            searcher_mode: which ranks iterate (see :class:`SearcherMode`).
            auto_ack: acknowledge running out of operations (:meth:`acknowledge_out_of_ops`).

        Raises:
            RuntimeError: a worker iterates in ``ChiefOnly`` mode, or the chief moves on without
                completing an operation.
        """
        mode = SearcherMode(searcher_mode)
        dist = self._distributed
        broadcast = mode is SearcherMode.WorkersAskChief and dist.size > 1
        if not dist.is_chief:
            if mode is not SearcherMode.WorkersAskChief:
                raise RuntimeError("searcher.operations() in ChiefOnly mode is for the chief only")
            while (length := dist.broadcast(None)) is not None:
                yield SearcherOperation(self._train, int(length), is_chief=False)
            return
        done = False
        while True:
            length = self._next_length(done)
            if broadcast:
                dist.broadcast(length)
            if length is None:
                if auto_ack:
                    self.acknowledge_out_of_ops()
                return
            op = SearcherOperation(self._train, length, is_chief=True, metric=self._metric)
            yield op
            if not op.completed:
                raise RuntimeError("op.report_completed() must be called on every operation")
            done = True

    def acknowledge_out_of_ops(self) -> None:
        """Records that the trial exits because it has no operation left (nothing to send: a run
        that exits 0 after its operation completes its trial)."""
        log.info("cairn: no searcher operations left")

    def get_configured_units(self) -> Unit | None:
        """The unit of ``searcher.max_length`` (``None`` for a bare number)."""
        return configured_units(self._config)
