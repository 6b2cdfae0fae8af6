"""YAML loading (YAML 1.2 floats) and ``key.path=value`` overrides applied before validation."""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

import yaml

from events.config.errors import ConfigError, join_path, show


class _Loader(yaml.SafeLoader):
    """Safe loader that also reads ``1e-4`` as a float, as YAML 1.2 (and Determined) do."""


class _Dumper(yaml.SafeDumper):
    """Safe dumper that quotes strings :class:`_Loader` would read as floats (``'1e5'``)."""


_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
for _cls in (_Loader, _Dumper):
    _cls.yaml_implicit_resolvers = {
        key: list(value) for key, value in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def dump_yaml(data: Any) -> str:
    """YAML text that :func:`load_yaml` reads back as ``data`` (keys in the given order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def load_yaml(text: str, source: str = "<config>") -> Any:
    """Parses YAML text safely.

    Raises:
        ConfigError: The text is not valid YAML; the message gives line and column.
    """
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError([(source, f"invalid YAML: {where}{problem}")]) from None


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
