"""``parse_config``: text or data, plus overrides, into a validated :class:`ExperimentConfig`."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from events.domain.config import common, hyperparameters, models, searcher
from events.domain.config.errors import ConfigError, from_validation_error, show
from events.domain.config.hyperparameters import normalize_hyperparameters
from events.domain.config.limits import check_size, check_storable
from events.domain.config.models import UINT32_MAX, ExperimentConfig
from events.domain.config.overrides import apply_overrides
from events.domain.config.safe_yaml import load_yaml


def _vocabulary() -> frozenset[str]:
    names: set[str] = set()
    for module in (common, hyperparameters, models, searcher):
        for item in vars(module).values():
            if isinstance(item, type) and issubclass(item, BaseModel):
                names.update(item.model_fields)
    return frozenset(names)


VOCABULARY = _vocabulary()
"""Every field name of the schema, used to suggest a fix for an unknown key."""


# Sections whose values are the user's own data, where ``null`` is a value, not "unset".
_VERBATIM = {("data",), ("hyperparameters",), ("environment", "pod_spec")}

EOL_SEARCHERS = {
    "custom": "the custom searcher",
    "adaptive": "the adaptive searcher",
    "adaptive_simple": "the adaptive_simple searcher",
    "sync_halving": "the sync_halving searcher",
}
"""Searchers Determined's schema still parses but refuses for new experiments (removed)."""


def drop_nulls(node: Any, path: tuple[str, ...] = ()) -> Any:
    """``node`` without the mapping keys whose value is ``null``.

    In Determined's schema every field may be ``null``, meaning "use the default"; dropping
    them lets the default apply. The user's own data (``data``, hyperparameter values, a pod
    spec) is kept as written.
    """
    if path in _VERBATIM:
        return node
    if isinstance(node, dict):
        return {
            key: drop_nulls(value, (*path, str(key)))
            for key, value in node.items()
            if value is not None
        }
    if isinstance(node, list):
        return [drop_nulls(item, path) for item in node]
    return node


def _refuse_removed_searcher(doc: dict[str, Any]) -> None:
    searcher = doc.get("searcher")
    name = searcher.get("name") if isinstance(searcher, dict) else None
    if name == "custom" and isinstance(searcher, dict) and "searcher_class" in searcher:
        return  # cairn's custom searcher (a class in the experiment's code), not Determined's
    if isinstance(name, str) and name in EOL_SEARCHERS:
        hint = (
            "; a cairn custom searcher names its class in searcher_class (module:Class), see "
            "docs/search-methods.md"
            if name == "custom"
            else ""
        )
        raise ConfigError(
            [
                (
                    "searcher.name",
                    f"{EOL_SEARCHERS[name]} was removed in Determined 0.38 and is not valid for "
                    "new experiments; use single, random, grid, async_halving, adaptive_asha, "
                    f"tpe or pbt{hint}",
                )
            ]
        )


def _fill_seed(doc: dict[str, Any], default_seed: int | None) -> None:
    repro = doc.get("reproducibility")
    if repro is None:
        repro = doc["reproducibility"] = {}
    if isinstance(repro, dict) and repro.get("experiment_seed") is None:
        seed = default_seed if default_seed is not None else int(time.time()) % (UINT32_MAX + 1)
        repro["experiment_seed"] = seed


def parse_config(
    raw: Mapping[str, Any] | str,
    overrides: Sequence[str] = (),
    *,
    default_seed: int | None = None,
) -> ExperimentConfig:
    """Validates an experiment config.

    Args:
        raw: YAML text or already-parsed data (not modified).
        overrides: ``key.path=value`` strings (value read as YAML), applied before validation.
        default_seed: Seed used when ``reproducibility.experiment_seed`` is absent; ``None`` means
            the current unix time, as Determined does.

    Returns:
        The frozen config, with every default filled and an experiment seed set.

    Raises:
        ConfigTooLargeError: The config is past the size limits of :mod:`events.domain.config.limits`.
        ConfigError: Every problem found, each with its dotted path.
    """
    if isinstance(raw, str):
        doc = load_yaml(raw)
    else:
        check_size(raw)
        doc = copy.deepcopy(dict(raw))
    if not isinstance(doc, dict):
        raise ConfigError([("<config>", f"must be a mapping, got {show(doc)}")])
    if overrides:
        doc = apply_overrides(doc, overrides)
        check_size(doc)
    check_storable(doc)
    doc = drop_nulls(doc)
    _refuse_removed_searcher(doc)
    _fill_seed(doc, default_seed)
    if "hyperparameters" in doc:
        doc["hyperparameters"] = normalize_hyperparameters(doc["hyperparameters"])
    try:
        return ExperimentConfig.model_validate(doc)
    except ValidationError as exc:
        raise from_validation_error(exc, doc, VOCABULARY) from None
