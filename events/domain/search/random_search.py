"""Random search: ``max_trials`` trials with independently sampled hyperparameters."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from events.domain.search.base import Create, Operation, SearchContext, SearchStrategy


class RandomStrategy(SearchStrategy):
    """Creates up to ``max_concurrent_trials`` trials, then one more per closed trial.

    Trials that exit with ``invalid_hp`` do not count against ``max_trials``: another trial is
    sampled in their place. Any other exit (errored, canceled) uses up its place.

    Args:
        max_trials: Trials to run in all.
        max_concurrent_trials: Live trials at most (0: no limit).
        target_units: Length a trial trains for when known (legacy ``max_length``), used only
            for progress.
    """

    def __init__(
        self, max_trials: int, max_concurrent_trials: int, target_units: int | None = None
    ) -> None:
        self.max_trials = max_trials
        self.max_concurrent = max_concurrent_trials
        self.target_units = target_units
        self.budget_used = 0
        self.live: list[str] = []
        self.invalid: list[str] = []
        self.closed_ids: list[str] = []
        self.fraction: dict[str, float] = {}

    def _fill(self, ctx: SearchContext) -> list[Operation]:
        ops: list[Operation] = []
        while self.budget_used < self.max_trials and (
            self.max_concurrent <= 0 or len(self.live) < self.max_concurrent
        ):
            create = self._create(ctx)
            self.budget_used += 1
            self.live.append(create.request_id)
            ops.append(create)
        return ops

    def _create(self, ctx: SearchContext) -> Create:
        return ctx.create()

    def initial(self, ctx: SearchContext) -> list[Operation]:
        """Fills the concurrency limit."""
        return self._fill(ctx)

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """Only tracks progress."""
        if self.target_units and time_value is not None:
            self.fraction[request_id] = min(time_value / self.target_units, 1.0)
        return []

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Gives back the budget place of a trial with invalid hyperparameters."""
        if reason == "invalid_hp":
            self.invalid.append(request_id)
            self.budget_used -= 1
        return []

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """Frees a concurrency place and refills it."""
        if request_id in self.live:
            self.live.remove(request_id)
        self.closed_ids.append(request_id)
        return self._fill(ctx)

    def reopened(self, ctx: SearchContext, request_id: str) -> None:
        """A continued trial is live again and holds its budget place once more."""
        if request_id in self.closed_ids:
            self.closed_ids.remove(request_id)
        if request_id in self.invalid:
            self.invalid.remove(request_id)
            self.budget_used += 1
        self.live.append(request_id)
        self.fraction.pop(request_id, None)

    def progress(self) -> float:
        """Mean over the budget of 1 per closed valid trial, else its trained fraction."""
        invalid = set(self.invalid)
        done = sum(1 for r in self.closed_ids if r not in invalid)
        partial = sum(f for r, f in self.fraction.items() if r in self.live and r not in invalid)
        return (done + partial) / self.max_trials

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "budget_used": self.budget_used,
            "live": list(self.live),
            "invalid": list(self.invalid),
            "closed": list(self.closed_ids),
            "fraction": dict(self.fraction),
        }

    def load(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state`."""
        self.budget_used = int(state["budget_used"])
        self.live = list(state["live"])
        self.invalid = list(state["invalid"])
        self.closed_ids = list(state["closed"])
        self.fraction = {str(k): float(v) for k, v in state["fraction"].items()}
