"""Config errors that name the dotted path, the offending value and what was expected.

Pydantic's ``ValidationError`` is translated here, and only here, into :class:`ConfigError`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

#: Error type of our own validators; context ``field``+``message`` or ``issues``, or none.
CAIRN_ERROR = "cairn_config"

# Tag of the nested-group member of the hyperparameter union (see hyperparameters.py).
_NESTED_GROUP_TAG = "group"


class ConfigError(Exception):
    """An experiment config was rejected.

    Attributes:
        errors: ``(path, message)`` pairs; ``path`` is dotted (``searcher.max_trials``, list items
            as ``bind_mounts[0]``), ``message`` says what was expected and what was found.
    """

    def __init__(self, errors: Iterable[tuple[str, str]]) -> None:
        self.errors: list[tuple[str, str]] = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{path}: {message}" for path, message in self.errors)

    def paths(self) -> list[str]:
        """Returns the dotted path of every error, in order."""
        return [path for path, _ in self.errors]


class ConfigTooLargeError(ConfigError):
    """A config was rejected for its size (text length or number of values), not its content."""


def show(value: Any, limit: int = 60) -> str:
    """Renders a config value for an error message, short and unambiguous."""
    if isinstance(value, str):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def join_path(parts: Sequence[str | int]) -> str:
    """Joins path parts into ``a.b[0].c`` form (``<config>`` for the root)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<config>"


def _is_union_node(path: Sequence[str | int]) -> bool:
    """Whether pydantic validated the node at ``path`` through a tagged union."""
    if list(path) in (["searcher"], ["checkpoint_storage"]):
        return True
    return len(path) >= 2 and path[0] == "hyperparameters"


def _tag_of(node: Any, path: Sequence[str | int]) -> str | None:
    if not isinstance(node, Mapping):
        return None
    key = "name" if list(path) == ["searcher"] else "type"
    tag = node.get(key)
    if isinstance(tag, str):
        return tag
    return _NESTED_GROUP_TAG if path[0] == "hyperparameters" else None


def _resolve(loc: Sequence[str | int], data: Any, keep_last: bool) -> tuple[list[str | int], Any]:
    """Maps a pydantic location onto the user's data, dropping union-member labels.

    Returns the cleaned path and the value found there (``None`` when it is absent).
    """
    path: list[str | int] = []
    node: Any = data
    expect_tag = False
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        # Pydantic names the chosen union member right after the union's field; that label is
        # not part of the user's document (a nested group may even hold a key of the same name).
        if expect_tag:
            expect_tag = False
            if part == _tag_of(node, path):
                continue
        if isinstance(node, Mapping) and part in node:
            node = node[part]
            path.append(part)
            expect_tag = _is_union_node(path)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            path.append(part)
        elif last and keep_last and isinstance(part, str | int):
            path.append(part)
            node = None
        # Any other part is a pydantic label (``str``, ``list[str]``, ``[key]``...): skipped.
    return path, node


_TYPE_NAMES = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a boolean (true/false)",
    "bool_parsing": "a boolean (true/false)",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "none_required": "null",
    "finite_number": "a finite number",
}

_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def _unknown_field(path: list[str | int], allowed: Iterable[str]) -> str:
    name = path[-1] if path else ""
    known = list(allowed)
    if name in known:
        return "unknown field (not valid in this section or for this searcher/type)"
    close = difflib.get_close_matches(name, known, n=1) if isinstance(name, str) else []
    return f"unknown field (did you mean {close[0]!r}?)" if close else "unknown field"


def _format(
    err: Mapping[str, Any], data: Any, vocabulary: Sequence[str]
) -> list[tuple[str, str | None, str]]:
    """Formats one pydantic error as ``(path, expected_type_or_None, message)`` triples."""
    kind = err["type"]
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == CAIRN_ERROR:
        base, _ = _resolve(loc, data, keep_last=False)
        issues = ctx.get("issues")
        if issues:
            return [(join_path([*base, *sub]), None, msg) for sub, msg in issues]
        if not ctx:
            return [(join_path(base), None, f"{err['msg']}, got {show(value)}")]
        field = ctx.get("field")
        parts = [*base, field] if field else base
        return [(join_path(parts), None, str(ctx.get("message", err["msg"])))]
    path, _ = _resolve(loc, data, keep_last=kind in ("missing", "extra_forbidden"))
    where = join_path(path)
    if kind == "missing":
        return [(where, None, "required field missing")]
    if kind == "extra_forbidden":
        return [(where, None, _unknown_field(path, vocabulary))]
    if kind in _TYPE_NAMES:
        return [(where, _TYPE_NAMES[kind], f"must be {_TYPE_NAMES[kind]}, got {show(value)}")]
    if kind in _BOUNDS:
        key, sign = _BOUNDS[kind]
        return [(where, None, f"must be {sign} {ctx.get(key)}, got {show(value)}")]
    if kind == "literal_error":
        return [(where, None, f"must be one of {ctx.get('expected')}, got {show(value)}")]
    if kind == "too_short":
        n = ctx.get("min_length")
        noun = "item" if n == 1 else "items"
        return [(where, None, f"must have at least {n} {noun}, got {show(value)}")]
    if kind == "too_long":
        return [(where, None, f"must have at most {ctx.get('max_length')} items")]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        key = str(ctx.get("discriminator", "")).strip("'")
        key = key if key.isidentifier() else "type"
        tagged = join_path([*path, key])
    if kind == "union_tag_invalid":
        # A nested group (or the cluster default storage) is not something a user names in
        # ``type``.
        tags = str(ctx.get("expected_tags", "")).replace(", 'group'", "").replace(", 'default'", "")
        return [(tagged, None, f"must be one of {tags}, got {show(ctx.get('tag'))}")]
    if kind == "union_tag_not_found":
        return [(tagged, None, "required field missing")]
    if kind in ("value_error", "assertion_error"):
        text = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        return [(where, None, text)]
    return [(where, None, f"{err['msg']}, got {show(value)}")]


def from_validation_error(
    exc: ValidationError, data: Any, vocabulary: Iterable[str] = ()
) -> ConfigError:
    """Translates a pydantic ``ValidationError`` raised on ``data`` into a :class:`ConfigError`.

    Args:
        exc: The error pydantic raised.
        data: The exact document pydantic validated (used to drop union labels from paths).
        vocabulary: Field names to suggest from when a key is unknown.

    Returns:
        A ``ConfigError`` with one entry per distinct problem; type errors that pydantic reports
        once per union member are merged into one ``must be A or B`` line.
    """
    words = sorted(set(vocabulary))
    merged: dict[str, list[tuple[str | None, str]]] = {}
    order: list[str] = []
    for err in exc.errors(include_url=False):
        for path, expected, message in _format(err, data, words):
            if path not in merged:
                merged[path] = []
                order.append(path)
            merged[path].append((expected, message))
    out: list[tuple[str, str]] = []
    for path in order:
        items = merged[path]
        kinds = [e for e, _ in items if e is not None]
        if len(kinds) > 1 and len(kinds) == len(items):
            got = items[0][1].rsplit(", got ", 1)[-1]
            names = list(dict.fromkeys(kinds))
            out.append((path, f"must be {' or '.join(names)}, got {got}"))
            continue
        for message in dict.fromkeys(m for _, m in items):
            out.append((path, message))
    return ConfigError(out)
