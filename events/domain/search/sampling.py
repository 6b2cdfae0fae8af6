"""Hyperparameter sampling and grid expansion.

Names are always visited in sorted order, so a config whose keys were reordered (JSONB does not
keep key order) samples exactly the same values from the same generator state.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
from collections.abc import Mapping
from typing import Any

from events.domain.config import CategoricalHP, ConstHP, DoubleHP, IntHP, LeafHP, LogHP
from events.domain.config.hyperparameters import iter_leaves


def sample_one(hp: LeafHP, rng: random.Random) -> Any:
    """Draws one value of a (non-group) hyperparameter."""
    if isinstance(hp, ConstHP):
        return copy.deepcopy(hp.val)
    if isinstance(hp, IntHP):
        return rng.randint(hp.minval, hp.maxval)
    if isinstance(hp, DoubleHP):
        return rng.uniform(hp.minval, hp.maxval)
    if isinstance(hp, LogHP):
        return hp.base ** rng.uniform(hp.minval, hp.maxval)
    return copy.deepcopy(hp.vals[rng.randrange(len(hp.vals))])


def sample_hparams(hps: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """Draws a value for every hyperparameter; nested groups come back as nested dicts."""
    out: dict[str, Any] = {}
    for name in sorted(hps):
        value = hps[name]
        out[name] = (
            sample_hparams(value, rng) if isinstance(value, dict) else sample_one(value, rng)
        )
    return out


def _round_half_away(x: float) -> int:
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def _spaced(lo: float, hi: float, count: int) -> list[float]:
    if count == 1:
        return [(lo + hi) / 2.0]
    return [lo + i * (hi - lo) / (count - 1) for i in range(count)]


def grid_axis(hp: LeafHP) -> list[Any]:
    """The values one hyperparameter takes on a grid.

    ``int``: ``count`` (clamped to the size of the range) evenly spaced points rounded to
    integers, duplicates dropped, the midpoint when ``count`` is 1. ``double``: ``count`` evenly
    spaced points including both ends. ``log``: ``base`` to the power of evenly spaced exponents.
    ``categorical``: every value. ``const``: its value.

    Raises:
        ValueError: A numeric hyperparameter has no ``count``.
    """
    if isinstance(hp, ConstHP):
        return [copy.deepcopy(hp.val)]
    if isinstance(hp, CategoricalHP):
        return copy.deepcopy(list(hp.vals))
    if hp.count is None:
        raise ValueError(f"{hp.type} hyperparameter needs a count for grid search")
    if isinstance(hp, IntHP):
        count = min(hp.count, hp.maxval - hp.minval + 1)
        points = [_round_half_away(v) for v in _spaced(hp.minval, hp.maxval, count)]
        return list(dict.fromkeys(points))
    if isinstance(hp, DoubleHP):
        return _spaced(hp.minval, hp.maxval, hp.count)
    return [hp.base**e for e in _spaced(hp.minval, hp.maxval, hp.count)]


def _nest(flat: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def grid_points(hps: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every point of the Cartesian product of all grid axes (one empty point if none).

    Nested groups are flattened by path for the product and rebuilt in each point. The order is
    the product's order over the sorted paths (the last path varies fastest).
    """
    leaves = list(iter_leaves(hps))
    axes = [grid_axis(hp) for _, hp in leaves]
    points: list[dict[str, Any]] = []
    for combo in itertools.product(*axes):
        flat = {path: copy.deepcopy(value) for (path, _), value in zip(leaves, combo, strict=True)}
        points.append(_nest(flat))
    return points


def grid_size(hps: Mapping[str, Any]) -> int:
    """How many points :func:`grid_points` returns, without building them."""
    return math.prod(len(grid_axis(hp)) for _, hp in iter_leaves(hps))


def sample_space_size(hps: Mapping[str, Any]) -> int | None:
    """How many distinct draws :func:`sample_hparams` can give; None when unbounded."""
    size = 1
    for _, hp in iter_leaves(hps):
        if isinstance(hp, ConstHP):
            continue
        if isinstance(hp, CategoricalHP):
            size *= len({repr(v) for v in hp.vals})
        elif isinstance(hp, IntHP):
            size *= hp.maxval - hp.minval + 1
        else:
            return None
    return size
