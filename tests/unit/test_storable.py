"""The cheap nesting check agrees with the full walk of :func:`find_unstorable` on depth."""

from __future__ import annotations

from typing import Any

from events.log.storable import find_unstorable, within_depth


def _nested(depth: int) -> Any:
    """A document ``depth`` levels deep, alternating lists and mappings, with scalars beside."""
    value: Any = "leaf"
    for level in range(depth):
        value = [1, value, "x"] if level % 2 else {"a": 1.5, "b": value, "c": None}
    return value


def test_within_depth_draws_the_line_where_the_full_walk_does() -> None:
    """At, below and above the limit, for mappings, lists and tuples and for scalars at the
    top, the fast check says fine exactly when the full walk finds nothing."""
    for depth in range(0, 8):
        for limit in range(1, 7):
            doc = _nested(depth)
            assert within_depth(doc, limit) == (find_unstorable(doc, max_depth=limit) is None)
    assert within_depth((1, (2, (3,))), 3) and not within_depth((1, (2, (3,))), 2)
    assert within_depth("text", 1) and within_depth(None, 1)


def test_a_wide_document_is_one_level_per_depth() -> None:
    """Siblings do not add depth: a body of 10,000 items, each a mapping holding a mapping
    (four levels: body, list, item, metrics), is within 4 and not within 3."""
    doc = {"items": [{"metrics": {"loss": 0.1}} for _ in range(10_000)]}
    assert within_depth(doc, 4)
    assert not within_depth(doc, 3)
