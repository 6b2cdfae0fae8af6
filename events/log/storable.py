"""What PostgreSQL's text and jsonb can hold, checked before anything is appended.

PostgreSQL refuses a NUL character in text and jsonb, UTF-8 cannot encode a lone surrogate
(``"\\ud800"``, which JSON and YAML escapes can produce), and jsonb has no NaN or infinity. A
document holding any of them must be refused where it enters, with its location, rather than
fail later inside an append.
"""

from __future__ import annotations

import math
from typing import Any

Path = list[str | int]

# A node's location as a linked list (parent link, key), materialized only when reported.
_Link = tuple["_Link", str | int] | None


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored in PostgreSQL text or jsonb; ``None`` when it can."""
    if "\x00" in text:
        return "text may not contain NUL characters"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = text[exc.start]
            return f"text may not contain a lone surrogate (U+{ord(bad):04X}), it is not Unicode"
    return None


def _path(link: _Link) -> Path:
    out: Path = []
    while link is not None:
        link, key = link
        out.append(key)
    out.reverse()
    return out


def within_depth(data: Any, max_depth: int) -> bool:
    """Whether ``data`` nests lists and mappings at most ``max_depth`` levels deep (the top
    level is depth 1). Visits each container once, level by level, and no scalar twice: a
    cheap first check before :func:`find_unstorable` is asked where the problem is."""
    level = [data] if isinstance(data, dict | list | tuple) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return False
        below: list[Any] = []
        for container in level:
            members = container.values() if isinstance(container, dict) else container
            below.extend(m for m in members if isinstance(m, dict | list | tuple))
        level = below
    return True


def find_unstorable(
    data: Any, *, max_depth: int | None = None, finite: bool = False
) -> tuple[Path, str] | None:
    """The first place in ``data`` (document order) that cannot be stored, and why.

    Walks iteratively, so a deeply nested document cannot exhaust the interpreter's stack.

    Args:
        data: Decoded JSON or YAML: dicts, lists, strings, numbers, booleans, ``None``.
        max_depth: Deepest nesting of lists and mappings allowed (the top level is depth 1);
            ``None``: no limit.
        finite: Whether NaN and infinities are refused too (otherwise the caller maps them).

    Returns:
        ``(path, message)`` of the first problem (``path`` is empty for ``data`` itself), or
        ``None`` when the whole document can be stored.
    """
    stack: list[tuple[Any, _Link, int]] = [(data, None, 0)]
    while stack:
        value, link, depth = stack.pop()
        if isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                return _path(link), problem
        elif isinstance(value, float):
            if finite and not math.isfinite(value):
                return _path(link), f"must be a finite number, got {value}"
        elif isinstance(value, dict | list | tuple):
            if max_depth is not None and depth + 1 > max_depth:
                return _path(link), f"nested more than {max_depth} levels deep"
            if isinstance(value, dict):
                items = list(value.items())
                for key, _ in items:
                    if isinstance(key, str):
                        problem = text_problem(key)
                        if problem is not None:
                            return _path(link), f"key {key[:40]!a}: {problem}"
            else:
                items = list(enumerate(value))
            for key, child in reversed(items):
                child_key = key if isinstance(key, str | int) else str(key)
                stack.append((child, (link, child_key), depth + 1))
    return None
