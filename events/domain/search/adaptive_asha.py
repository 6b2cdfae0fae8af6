"""Adaptive ASHA: several ASHA brackets of different depth run side by side.

The deepest useful bracket has ``min(max_rungs, floor(log_d(max_time)) + 1,
floor(log_d(max_trials)) + 1)`` rungs (``d`` the divisor). ``mode`` picks the brackets:
``aggressive`` only the deepest, ``standard`` the deeper half, ``conservative`` all depths from 1
(``bracket_rungs`` overrides). Deeper brackets (more early stopping) come first. Each bracket gets
trials in proportion to ``d ** (rungs - 1) / rungs`` (roughly equal budget per bracket; at least 1
each, the remainder to the first) and an even share of ``max_concurrent_trials``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from events.domain.search.asha import ASHAStrategy
from events.domain.search.base import (
    Create,
    Operation,
    SearchContext,
    SearcherError,
    SearchStrategy,
)


def _floor_log(value: int, base: float) -> int:
    """Largest ``k`` with ``base ** k <= value`` (exact, unlike ``log(value) / log(base)``)."""
    k = max(int(math.log(value) / math.log(base)), 0) if value >= 1 else 0
    while k > 0 and base**k > value:
        k -= 1
    while base ** (k + 1) <= value:
        k += 1
    return k


def max_rungs_for(max_rungs: int, divisor: float, max_time: int, max_trials: int) -> int:
    """Depth of the deepest bracket worth running."""
    return min(max_rungs, _floor_log(max_time, divisor) + 1, _floor_log(max_trials, divisor) + 1)


def bracket_rungs_for(mode: str, max_rungs: int) -> list[int]:
    """Rung counts of the brackets a mode runs, deepest first."""
    if mode == "aggressive":
        rungs = [max_rungs]
    elif mode == "standard":
        rungs = list(range((max_rungs - 1) // 2 + 1, max_rungs + 1))
    elif mode == "conservative":
        rungs = list(range(1, max_rungs + 1))
    else:
        raise ValueError(f"unknown adaptive mode {mode!r}")
    return sorted(rungs, reverse=True)


def bracket_max_trials(max_trials: int, divisor: float, brackets: list[int]) -> list[int]:
    """Trials per bracket, in proportion to ``divisor ** (rungs - 1) / rungs``."""
    weights = [divisor ** (r - 1) / r for r in brackets]
    total = sum(weights)
    counts = [max(int(w / total * max_trials), 1) for w in weights]
    counts[0] += max(max_trials - sum(counts), 0)
    return counts


def bracket_max_concurrent(
    max_concurrent_trials: int, divisor: float, max_trials: list[int]
) -> list[int]:
    """Concurrency per bracket: an even split (at least 1 each), remainder to the first."""
    n = len(max_trials)
    if max_concurrent_trials == 0:
        return [max(max_trials[-1], int(divisor))] * n
    total = max(max_concurrent_trials, n)
    shares = [total // n] * n
    for i in range(total % n):
        shares[i] += 1
    return shares


class AdaptiveASHAStrategy(SearchStrategy):
    """Routes every trial event to the bracket that created the trial.

    Args:
        brackets: One :class:`ASHAStrategy` per bracket, deepest first.
    """

    def __init__(self, brackets: list[ASHAStrategy]) -> None:
        if not brackets:
            raise ValueError("adaptive ASHA needs at least one bracket")
        self.brackets = brackets
        self.owner: dict[str, int] = {}

    def _mark(self, index: int, ops: list[Operation]) -> list[Operation]:
        for op in ops:
            if isinstance(op, Create):
                self.owner[op.request_id] = index
        return ops

    def _bracket(self, request_id: str) -> tuple[int, ASHAStrategy]:
        if request_id not in self.owner:
            raise SearcherError(f"{request_id!r} belongs to no bracket")
        index = self.owner[request_id]
        return index, self.brackets[index]

    def initial(self, ctx: SearchContext) -> list[Operation]:
        """Starts every bracket, deepest first."""
        ops: list[Operation] = []
        for index, bracket in enumerate(self.brackets):
            ops += self._mark(index, bracket.initial(ctx))
        return ops

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """Forwards to the trial's bracket."""
        index, bracket = self._bracket(request_id)
        return self._mark(index, bracket.validation(ctx, request_id, metric, time_value))

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Forwards to the trial's bracket."""
        index, bracket = self._bracket(request_id)
        return self._mark(index, bracket.exited_early(ctx, request_id, reason))

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """Forwards to the trial's bracket."""
        index, bracket = self._bracket(request_id)
        return self._mark(index, bracket.closed(ctx, request_id))

    def progress(self) -> float:
        """Mean progress of the brackets."""
        return sum(b.progress() for b in self.brackets) / len(self.brackets)

    def bracket_of(self, request_id: str) -> int:
        """Index of the bracket that created ``request_id``."""
        return self._bracket(request_id)[0]

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {"brackets": [b.state() for b in self.brackets], "owner": dict(self.owner)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state`."""
        if len(state["brackets"]) != len(self.brackets):
            raise SearcherError("snapshot brackets do not match this config")
        for bracket, sub in zip(self.brackets, state["brackets"], strict=True):
            bracket.load(sub)
        self.owner = {str(k): int(v) for k, v in state["owner"].items()}
