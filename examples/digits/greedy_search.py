"""A custom searcher for the digits example: random trials first, then perturb the best so far.

Run it with ``cairn experiment create custom.yaml .`` (see ``docs/search-methods.md``).
"""

from __future__ import annotations

import math
from typing import Any

from cairn.searcher import Operation, SearcherContext, SearchMethod


class GreedySearch(SearchMethod):
    """``startup`` random trials at once; each time a trial ends, one more trial whose numeric
    hyperparameters are the best trial's, each scaled by a random factor in
    ``[1 - spread, 1 + spread]``, until ``max_trials`` trials exist."""

    def __init__(self, context: SearcherContext, startup: int = 4, spread: float = 0.3) -> None:
        super().__init__(context)
        self.startup = startup
        self.spread = spread
        self.hparams: dict[str, dict[str, Any]] = {}
        self.last: dict[str, float] = {}
        self.best: tuple[float, str] | None = None
        self.created = 0

    def _create(self, hparams: dict[str, Any] | None = None) -> Operation:
        create = self.context.create(hparams)
        self.hparams[create.request_id] = create.hparams
        self.created += 1
        return create

    def initial_operations(self) -> list[Operation]:
        count = min(self.startup, self.context.max_trials)
        return [self._create() for _ in range(count)]

    def on_validation(
        self, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        if metric is not None and math.isfinite(metric):
            self.last[request_id] = metric if self.context.smaller_is_better else -metric
        return []

    def on_trial_exited(self, request_id: str, reason: str | None) -> list[Operation]:
        score = self.last.get(request_id)
        if reason is None and score is not None and (self.best is None or score < self.best[0]):
            self.best = (score, request_id)
        if self.created >= self.context.max_trials:
            return []
        if self.best is None:
            return [self._create()]
        base = dict(self.hparams[self.best[1]])
        for name, value in base.items():
            bounds = self._bounds(name)
            if bounds is None:
                continue
            scaled = value * self.context.rng.uniform(1 - self.spread, 1 + self.spread)
            scaled = min(max(scaled, bounds[0]), bounds[1])
            base[name] = round(scaled) if isinstance(value, int) else scaled
        return [self._create(base)]

    def _bounds(self, name: str) -> tuple[float, float] | None:
        """The range of a numeric hyperparameter (``None`` for any other)."""
        hp = self.context.hyperparameters.get(name)
        if not isinstance(hp, dict):
            return None
        if hp.get("type") in ("int", "double"):
            return float(hp["minval"]), float(hp["maxval"])
        if hp.get("type") == "log":
            base = float(hp.get("base", 10.0))
            return base ** float(hp["minval"]), base ** float(hp["maxval"])
        return None
