"""Merging partial configs: a template under an experiment's config, a change over it.

Determined's rule for templates: where both sides set a mapping the two are merged key by key;
anywhere else the side on top wins outright (a list is replaced, never concatenated).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def merge_under(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` merged over ``base``: mappings key by key, every other value from ``top`` when it
    sets one. Neither argument is modified.

    Args:
        base: the partial config underneath (a template, or the current config).
        top: the config whose values win.

    Returns:
        A new mapping.
    """
    out: dict[str, Any] = copy.deepcopy(dict(base))
    for key, value in top.items():
        below = out.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            out[key] = merge_under(below, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[str]:
    """The dotted paths where ``after`` differs from ``before`` (mappings compared key by key,
    any other value as a whole), sorted."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        paths: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            where = f"{prefix}.{key}" if prefix else str(key)
            if key not in before or key not in after:
                paths.append(where)
            else:
                paths.extend(changed_paths(before[key], after[key], where))
        return paths
    return [] if before == after else [prefix or "<config>"]
