"""The typed settings every fold of an experiment reads from its config, with their defaults.

A submitted config is stored as the JSON it was validated as (so a later, stricter schema never
makes an old log unreadable); the folds read what they act on through :class:`Scheduling`, whose
defaults are the config models' own (:class:`~events.domain.config.models.ResourcesConfig`,
:class:`~events.domain.config.models.ExperimentConfig`), so a default is written once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from events.domain.config.models import ExperimentConfig, ResourcesConfig
from events.domain.config.searcher import SingleSearcher

DEFAULT_PRIORITY = 42
"""The priority of an experiment whose ``resources.priority`` is unset (Determined's
``default_priority``; 1 is the most important, 99 the least)."""


def _default(model: type[Any], name: str) -> Any:
    return model.model_fields[name].default


@dataclass(frozen=True)
class Scheduling:
    """What the scheduler and the views read of an experiment's config (defaults applied; a
    ``slots_per_trial`` of 0 counts as 1, as a trial always holds a slot)."""

    slots_per_trial: int = _default(ResourcesConfig, "slots_per_trial")
    priority: int = DEFAULT_PRIORITY
    weight: float = _default(ResourcesConfig, "weight")
    max_slots: int | None = _default(ResourcesConfig, "max_slots")
    pool: str = _default(ResourcesConfig, "resource_pool")
    max_restarts: int = _default(ExperimentConfig, "max_restarts")
    metric: str | None = None
    smaller_is_better: bool = _default(SingleSearcher, "smaller_is_better")

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Scheduling:
        """The settings of a stored config (a missing or null field takes its default)."""
        resources = _section(config, "resources")
        searcher = _section(config, "searcher")
        metric = searcher.get("metric")
        smaller = searcher.get("smaller_is_better")
        return cls(
            slots_per_trial=int(resources.get("slots_per_trial") or cls.slots_per_trial),
            priority=_int(resources.get("priority"), DEFAULT_PRIORITY),
            weight=float(resources.get("weight") or cls.weight),
            max_slots=_int(resources.get("max_slots"), None),
            pool=str(resources.get("resource_pool") or cls.pool),
            max_restarts=_int(config.get("max_restarts"), cls.max_restarts),
            metric=metric if isinstance(metric, str) else None,
            smaller_is_better=cls.smaller_is_better if smaller is None else bool(smaller),
        )


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    section = config.get(name)
    return section if isinstance(section, Mapping) else {}


def _int(value: Any, default: Any) -> Any:
    return default if value is None else int(value)
