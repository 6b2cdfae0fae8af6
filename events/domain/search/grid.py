"""Grid search: one trial per point of the hyperparameter grid."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from events.domain.search.base import Create, SearchContext
from events.domain.search.random_search import RandomStrategy
from events.domain.search.sampling import grid_points


class GridStrategy(RandomStrategy):
    """Walks the grid in :func:`grid_points` order, ``max_concurrent_trials`` at a time.

    A grid point whose trial exits with ``invalid_hp`` is not retried (there is nothing else to
    sample); it counts as done.
    """

    def __init__(
        self,
        hparams: Mapping[str, Any],
        max_concurrent_trials: int,
        target_units: int | None = None,
    ) -> None:
        self.points = grid_points(hparams)
        super().__init__(len(self.points), max_concurrent_trials, target_units)

    def _create(self, ctx: SearchContext) -> Create:
        return ctx.create(copy.deepcopy(self.points[self.budget_used]))

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Any]:
        """Nothing to replace on a grid."""
        return []
