"""Hyperparameter definitions: const, int, double, log, categorical and nested groups.

A hyperparameter is written either as a mapping with a ``type`` key, as a nested group (a mapping
without ``type`` whose values are hyperparameters), or as shorthand: any other value is a
constant. :func:`normalize_hyperparameters` rewrites shorthand into the explicit form.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Discriminator, Field, JsonValue, Tag, model_validator
from typing_extensions import TypeAliasType

from events.domain.config.common import ConfigModel, field_error
from events.domain.config.limits import MAX_HP_DOUBLE, MAX_HP_INT, MAX_TRIALS

HP_TYPES = ("const", "int", "double", "log", "categorical")

HPInt = Annotated[int, Field(ge=-MAX_HP_INT, le=MAX_HP_INT)]
HPDouble = Annotated[float, Field(ge=-MAX_HP_DOUBLE, le=MAX_HP_DOUBLE)]
GridCount = Annotated[int, Field(ge=1, le=MAX_TRIALS)]


class ConstHP(ConfigModel):
    """A fixed value passed to every trial as is."""

    type: Literal["const"]
    val: JsonValue


def _check_range(lo: float, hi: float) -> None:
    if lo >= hi:
        raise field_error("minval", f"must be < maxval ({lo} >= {hi})")


class IntHP(ConfigModel):
    """An integer drawn uniformly from ``[minval, maxval]`` (both ends included)."""

    type: Literal["int"]
    minval: HPInt
    maxval: HPInt
    count: GridCount | None = None

    @model_validator(mode="after")
    def _ordered(self) -> IntHP:
        _check_range(self.minval, self.maxval)
        return self


class DoubleHP(ConfigModel):
    """A float drawn uniformly from ``[minval, maxval]``."""

    type: Literal["double"]
    minval: HPDouble
    maxval: HPDouble
    count: GridCount | None = None

    @model_validator(mode="after")
    def _ordered(self) -> DoubleHP:
        _check_range(self.minval, self.maxval)
        return self


class LogHP(ConfigModel):
    """``base ** u`` with ``u`` drawn uniformly from ``[minval, maxval]``."""

    type: Literal["log"]
    minval: HPDouble
    maxval: HPDouble
    base: float = Field(10.0, gt=0, le=MAX_HP_DOUBLE)
    count: GridCount | None = None

    @model_validator(mode="after")
    def _ordered(self) -> LogHP:
        _check_range(self.minval, self.maxval)
        for end in ("minval", "maxval"):
            exponent = getattr(self, end)
            try:
                finite = math.isfinite(self.base**exponent)
            except OverflowError:
                finite = False
            if not finite:
                raise field_error(end, f"base ** {end} ({self.base} ** {exponent}) is too large")
        return self


class CategoricalHP(ConfigModel):
    """One of ``vals``, each equally likely."""

    type: Literal["categorical"]
    vals: list[JsonValue] = Field(min_length=1)


def _is_group(value: Mapping[Any, Any]) -> bool:
    # A mapping is a group unless it has a ``type``; a group may hold a member named ``type``,
    # which is then itself a hyperparameter (a mapping), never a type name.
    return "type" not in value or isinstance(value["type"], Mapping)


def _hp_tag(value: Any) -> str | None:
    if isinstance(value, Mapping):
        return "group" if _is_group(value) else str(value["type"])
    kind = getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


if TYPE_CHECKING:
    Hyperparameter = (
        ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP | dict[str, "Hyperparameter"]
    )
else:
    Hyperparameter = TypeAliasType(
        "Hyperparameter",
        Annotated[
            Annotated[ConstHP, Tag("const")]
            | Annotated[IntHP, Tag("int")]
            | Annotated[DoubleHP, Tag("double")]
            | Annotated[LogHP, Tag("log")]
            | Annotated[CategoricalHP, Tag("categorical")]
            | Annotated[dict[str, "Hyperparameter"], Tag("group")],
            Discriminator(_hp_tag),
        ],
    )
"""One hyperparameter or a nested group (``dict`` of name to hyperparameter)."""

Hyperparameters = dict[str, Hyperparameter]

LeafHP = ConstHP | IntHP | DoubleHP | LogHP | CategoricalHP


def _normalize_one(value: Any) -> Any:
    if isinstance(value, Mapping):
        if not _is_group(value):
            return dict(value)
        return {k: _normalize_one(v) for k, v in value.items()}
    return {"type": "const", "val": value}


def normalize_hyperparameters(raw: Any) -> Any:
    """Rewrites shorthand constants into ``{type: const, val: ...}``; other input is returned as is.

    Idempotent: normalizing an already normalized mapping returns an equal mapping.
    """
    if not isinstance(raw, Mapping):
        return raw
    return {k: _normalize_one(v) for k, v in raw.items()}


def iter_leaves(
    hps: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], LeafHP]]:
    """Yields ``(path, hyperparameter)`` for every non-group hyperparameter, in sorted order."""
    for name in sorted(hps):
        value = hps[name]
        if isinstance(value, dict):
            yield from iter_leaves(value, (*prefix, name))
        else:
            yield (*prefix, name), value


def axis_size(hp: LeafHP) -> int:
    """How many values ``hp`` takes on a grid, at most (``count`` is clamped to an ``int``
    range; a numeric hyperparameter without ``count`` counts as 1)."""
    if isinstance(hp, ConstHP):
        return 1
    if isinstance(hp, CategoricalHP):
        return len(hp.vals)
    if hp.count is None:
        return 1
    if isinstance(hp, IntHP):
        return min(hp.count, hp.maxval - hp.minval + 1)
    return hp.count


def grid_issues(hps: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """Problems of ``hps`` for a grid search, with paths relative to ``hyperparameters``: numeric
    hyperparameters lacking ``count``, and a grid of more than ``MAX_TRIALS`` points (refused
    before anything enumerates it)."""
    issues: list[tuple[tuple[str | int, ...], str]] = []
    points = 1
    for path, hp in iter_leaves(hps):
        if isinstance(hp, IntHP | DoubleHP | LogHP) and hp.count is None:
            issues.append(
                ((*path, "count"), f"required for grid search ({hp.type} hyperparameter)")
            )
        if points <= MAX_TRIALS:
            points *= axis_size(hp)
    if points > MAX_TRIALS:
        issues.append(
            ((), f"the grid has more than {MAX_TRIALS} points (the product of every axis's size)")
        )
    return issues
