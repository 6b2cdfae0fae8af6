"""An experiment's settings: the typed fields every reader of a submitted config acts on.

A submitted config is stored as the JSON it was validated as (so a later, stricter schema never
makes an old log unreadable). Folds, deciders, projections and routes read it through
:class:`ExperimentSettings` (``ExperimentSubmitted.settings``, ``ExperimentView.settings``), whose
defaults are the config models' own (:class:`~events.domain.config.models.ResourcesConfig`,
:class:`~events.domain.config.models.ExperimentConfig`), so a default is written once and no
reader indexes the stored dict.
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
class ExperimentSettings:
    """What the folds, the scheduler, the projections and the views read of an experiment's
    config, defaults applied (a ``slots_per_trial`` of 0 counts as 1, as a trial always holds a
    slot).

    ``name`` and ``description`` are ``None`` when the config sets none.
    """

    name: str | None = None
    description: str | None = None
    labels: tuple[str, ...] = ()
    searcher_name: str | None = None
    max_trials: int | None = None
    metric: str | None = None
    smaller_is_better: bool = _default(SingleSearcher, "smaller_is_better")
    slots_per_trial: int = _default(ResourcesConfig, "slots_per_trial")
    priority: int = DEFAULT_PRIORITY
    weight: float = _default(ResourcesConfig, "weight")
    max_slots: int | None = _default(ResourcesConfig, "max_slots")
    pool: str = _default(ResourcesConfig, "resource_pool")
    max_restarts: int = _default(ExperimentConfig, "max_restarts")

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> ExperimentSettings:
        """The settings of a stored config (a missing or null field takes its default)."""
        resources = section(config, "resources")
        searcher = section(config, "searcher")
        metric = searcher.get("metric")
        smaller = searcher.get("smaller_is_better")
        searcher_name = searcher.get("name")
        labels = config.get("labels")
        return cls(
            name=_str(config.get("name")),
            description=_str(config.get("description")),
            labels=tuple(str(x) for x in labels) if isinstance(labels, list) else (),
            searcher_name=searcher_name if isinstance(searcher_name, str) else None,
            max_trials=_whole(searcher.get("max_trials")),
            metric=metric if isinstance(metric, str) else None,
            smaller_is_better=cls.smaller_is_better if smaller is None else bool(smaller),
            slots_per_trial=int(resources.get("slots_per_trial") or cls.slots_per_trial),
            priority=_int(resources.get("priority"), DEFAULT_PRIORITY),
            weight=float(resources.get("weight") or cls.weight),
            max_slots=_int(resources.get("max_slots"), None),
            pool=str(resources.get("resource_pool") or cls.pool),
            max_restarts=_int(config.get("max_restarts"), cls.max_restarts),
        )


def section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A config section as stored (empty when absent or not a mapping)."""
    value = config.get(name)
    return value if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _int(value: Any, default: Any) -> Any:
    return default if value is None else int(value)
