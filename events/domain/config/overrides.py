"""``key.path=value`` overrides (values read as YAML) applied to a config before validation."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from events.domain.config.errors import ConfigError, join_path, show
from events.domain.config.safe_yaml import load_yaml


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """Splits ``a.b.c=value`` into its path and its YAML-parsed value.

    Raises:
        ConfigError: No ``=``, an empty key, or a value that is not valid YAML.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError([("<override>", f"must look like key.path=value, got {show(text)}")])
    path: list[str | int] = [int(p) if p.isdigit() else p for p in key.split(".")]
    value = load_yaml(raw, source=f"<override {key}>") if raw.strip() else None
    return path, value


def _set(doc: dict[str, Any], path: list[str | int], value: Any, text: str) -> None:
    node: Any = doc
    for i, part in enumerate(path[:-1]):
        here = join_path(path[: i + 1])
        if isinstance(node, list) and isinstance(part, int):
            if part >= len(node):
                raise ConfigError([(here, f"no item {part} in a list of {len(node)} ({text})")])
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise ConfigError([(join_path(path[:i]), f"is {show(node)}, not a mapping ({text})")])
        child = node.get(str(part))
        if child is None:
            child = node[str(part)] = {}
        node = child
    last = path[-1]
    if isinstance(node, list) and isinstance(last, int) and last < len(node):
        node[last] = value
    elif isinstance(node, dict):
        node[str(last)] = value
    else:
        raise ConfigError([(join_path(path[:-1]), f"is {show(node)}, not a mapping ({text})")])


def apply_overrides(doc: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Returns a copy of ``doc`` with every ``key.path=value`` override set, in order."""
    out = copy.deepcopy(doc)
    for text in overrides:
        path, value = parse_override(text)
        _set(out, path, value, text)
    return out
