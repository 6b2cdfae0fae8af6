"""Single search: exactly one trial (non-const hyperparameters are drawn once)."""

from __future__ import annotations

from services.searcher.methods.random_search import RandomStrategy


class SingleStrategy(RandomStrategy):
    """One trial; an ``invalid_hp`` exit is replaced like in random search."""

    def __init__(self, target_units: int | None = None) -> None:
        super().__init__(max_trials=1, max_concurrent_trials=1, target_units=target_units)
