"""Asynchronous successive halving (ASHA), stop-based as in Determined 0.38.

Rung ``i`` of ``n`` sits at ``max(floor(max_time / divisor ** (n - 1 - i)), 1)`` on the time axis
(absolute values; the top rung is ``max_time``). Trials train on their own; each validation that
reaches a rung records the trial's metric there. A trial continues only while it ranks in the top
``max(floor(len(rung) / divisor), 1)`` of each rung it reaches; otherwise, or once it reaches the
top rung, it is stopped, and a new trial is created while fewer than ``max_trials`` exist.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Mapping
from typing import Any

from events.domain.search.base import (
    Operation,
    SearchContext,
    SearcherError,
    SearchStrategy,
    Stop,
)

#: The value an early-exited trial is given in its rung: worse than any real metric.
WORST = sys.float_info.max


def rung_units(num_rungs: int, divisor: float, max_time: int) -> list[int]:
    """Time-axis value of each rung, lowest first."""
    return [max(int(max_time / divisor ** (num_rungs - 1 - i)), 1) for i in range(num_rungs)]


def initial_trial_count(
    max_trials: int, max_concurrent_trials: int, num_rungs: int, divisor: float
) -> int:
    """How many trials ASHA starts with (and so keeps running, one new per stop)."""
    if max_concurrent_trials > 0:
        return min(max_concurrent_trials, max_trials)
    return min(max(int(divisor ** (num_rungs - 1)), 1), max_trials)


class ASHAStrategy(SearchStrategy):
    """One ASHA bracket.

    Args:
        num_rungs: Number of rungs.
        divisor: Keep the top ``1/divisor`` of each rung.
        max_trials: Trials to run in all (``invalid_hp`` trials not counted).
        max_concurrent_trials: Trials started at first (0: ``divisor ** (num_rungs - 1)``).
        max_time: Top rung's value on the time axis.
        smaller_is_better: Metric direction.
    """

    def __init__(
        self,
        num_rungs: int,
        divisor: float,
        max_trials: int,
        max_concurrent_trials: int,
        max_time: int,
        smaller_is_better: bool = True,
    ) -> None:
        self.num_rungs = num_rungs
        self.divisor = divisor
        self.max_trials = max_trials
        self.max_concurrent = max_concurrent_trials
        self.smaller_is_better = smaller_is_better
        self.units = rung_units(num_rungs, divisor, max_time)
        # Per rung: sorted signed metrics and, aligned with them, the request ids.
        self.values: list[list[float]] = [[] for _ in range(num_rungs)]
        self.owners: list[list[str]] = [[] for _ in range(num_rungs)]
        self.trial_rung: dict[str, int] = {}
        self.early_exits: list[str] = []
        self.stopped: list[str] = []
        # Members of ``stopped`` or ``early_exits``, for constant-time membership tests.
        self.finished: set[str] = set()
        self.completed = 0
        self.invalid = 0

    # -- helpers ----------------------------------------------------------------------------

    def _create(self, ctx: SearchContext) -> Operation:
        create = ctx.create()
        self.trial_rung[create.request_id] = 0
        return create

    def _room(self) -> bool:
        return len(self.trial_rung) - self.invalid < self.max_trials

    def _insert(self, rung: int, request_id: str, value: float) -> int:
        # Ties go before existing equal values (the newcomer is not penalised).
        index = bisect.bisect_left(self.values[rung], value)
        self.values[rung].insert(index, value)
        self.owners[rung].insert(index, request_id)
        return index

    def _signed(self, metric: float) -> float:
        if math.isnan(metric):
            return WORST
        value = metric if self.smaller_is_better else -metric
        return min(max(value, -WORST), WORST)

    # -- events -----------------------------------------------------------------------------

    def initial(self, ctx: SearchContext) -> list[Operation]:
        """Starts the first trials."""
        count = initial_trial_count(
            self.max_trials, self.max_concurrent, self.num_rungs, self.divisor
        )
        return [self._create(ctx) for _ in range(count)]

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """Records the metric in every rung the trial has now reached; may stop it."""
        if request_id not in self.trial_rung:
            raise SearcherError(f"{request_id!r} was not created by this bracket")
        if time_value is None:
            raise SearcherError(f"ASHA needs a time value with each validation ({request_id})")
        if request_id in self.finished:
            return []
        value = self._signed(metric)
        ops: list[Operation] = []
        for rung in range(self.trial_rung[request_id], self.num_rungs):
            self.trial_rung[request_id] = rung
            if time_value < self.units[rung]:
                break
            index = self._insert(rung, request_id, value)
            keep = max(int(len(self.values[rung]) / self.divisor), 1)
            if rung == self.num_rungs - 1 or index >= keep:
                self.stopped.append(request_id)
                self.finished.add(request_id)
                ops.append(Stop(request_id))
                break
        if ops and self._room():
            ops.append(self._create(ctx))
        return ops

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Drops an ``invalid_hp`` trial entirely; ranks any other early exit as worst."""
        if request_id not in self.trial_rung:
            raise SearcherError(f"{request_id!r} was not created by this bracket")
        if request_id in self.finished:
            return []
        self.early_exits.append(request_id)
        self.finished.add(request_id)
        if reason == "invalid_hp":
            self.invalid += 1
            for rung in range(self.trial_rung[request_id] + 1):
                if request_id in self.owners[rung]:
                    index = self.owners[rung].index(request_id)
                    del self.owners[rung][index]
                    del self.values[rung][index]
            return [self._create(ctx)]
        self._insert(self.trial_rung[request_id], request_id, WORST)
        return [self._create(ctx)] if self._room() else []

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """Counts a finished trial (for progress only)."""
        self.completed += 1
        return []

    def progress(self) -> float:
        """Trials that reached rung 0 over ``1.2 * max_trials``; completed share at the end."""
        reached = len(self.values[0])
        value = reached / (1.2 * self.max_trials)
        if reached >= self.max_trials:
            value = max(value, (self.completed - self.invalid) / self.max_trials)
        return value

    # -- state ------------------------------------------------------------------------------

    def rungs(self) -> list[dict[str, Any]]:
        """Each rung's units and ``(request_id, signed metric)`` pairs, best first."""
        return [
            {"units": u, "metrics": [[r, v] for r, v in zip(o, vs, strict=True)]}
            for u, o, vs in zip(self.units, self.owners, self.values, strict=True)
        ]

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "rungs": self.rungs(),
            "trial_rung": dict(self.trial_rung),
            "early_exits": list(self.early_exits),
            "stopped": list(self.stopped),
            "completed": self.completed,
            "invalid": self.invalid,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state`."""
        rungs = state["rungs"]
        if [r["units"] for r in rungs] != self.units:
            raise SearcherError("snapshot rungs do not match this config")
        self.owners = [[str(m[0]) for m in r["metrics"]] for r in rungs]
        self.values = [[float(m[1]) for m in r["metrics"]] for r in rungs]
        self.trial_rung = {str(k): int(v) for k, v in state["trial_rung"].items()}
        self.early_exits = list(state["early_exits"])
        self.stopped = list(state["stopped"])
        self.finished = {*self.early_exits, *self.stopped}
        self.completed = int(state["completed"])
        self.invalid = int(state["invalid"])
