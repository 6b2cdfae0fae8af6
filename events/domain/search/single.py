"""Single search: exactly one trial (non-const hyperparameters are drawn once)."""

from __future__ import annotations

from events.domain.search.base import Operation, SearchContext
from events.domain.search.random_search import RandomStrategy
from events.domain.search.sampling import sample_space_size


class SingleStrategy(RandomStrategy):
    """One trial; an ``invalid_hp`` exit is replaced by a new draw like in random search.

    When every hyperparameter has a single possible value, a new draw would repeat the refused
    one, so an ``invalid_hp`` exit ends the search instead of looping forever.
    """

    def __init__(self, target_units: int | None = None) -> None:
        super().__init__(max_trials=1, max_concurrent_trials=1, target_units=target_units)

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Replaces an ``invalid_hp`` trial only when a new draw can differ."""
        if reason == "invalid_hp" and sample_space_size(ctx.hparams) == 1:
            return []
        return super().exited_early(ctx, request_id, reason)
