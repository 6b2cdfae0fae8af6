"""The store is sealed: services read the log only through the store's reads (which upcast at
the boundary) and never reach its connection pool (the pool is the store's own)."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("services", "cairn")

_EVENTS_SQL = re.compile(r"\b(?:FROM|JOIN)\s+(?:ONLY\s+)?events\b(?!\s*\()")

_POOL_METHODS = frozenset(
    {"acquire", "release", "fetch", "fetchrow", "fetchval", "execute", "executemany", "close"}
)


def _pool_uses(tree: ast.AST) -> int:
    """Uses of a store's connection pool: ``<...store>.pool`` or ``<x>.pool.<pool method>``
    (a resource pool, ``agent.pool``, is neither)."""
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        if (node.attr == "pool" and "store" in ast.unparse(node.value).lower()) or (
            node.attr in _POOL_METHODS
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "pool"
            and "store" not in ast.unparse(node.value.value).lower()
        ):
            count += 1
    return count


def _modules() -> list[Path]:
    return sorted(p for top in SCANNED for p in (ROOT / top).rglob("*.py"))


def _strings(tree: ast.AST) -> list[str]:
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _found() -> tuple[Counter[str], Counter[str]]:
    sql: Counter[str] = Counter()
    pool: Counter[str] = Counter()
    for path in _modules():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        sql[rel] += sum(len(_EVENTS_SQL.findall(text)) for text in _strings(tree))
        pool[rel] += _pool_uses(tree)
    return +sql, +pool


def test_no_service_reads_the_events_table_with_sql() -> None:
    """No module under services/ or cairn/ holds SQL reading ``events``: the store's reads do."""
    sql, _ = _found()
    assert dict(sql) == {}


def test_no_service_uses_a_store_pool() -> None:
    """No module under services/ or cairn/ reaches a store's connection pool."""
    _, pool = _found()
    assert dict(pool) == {}


def test_the_scan_sees_a_read_of_events_and_a_pool() -> None:
    """The scan is not vacuous: a synthetic module reading ``events`` and a pool is caught."""
    tree = ast.parse('q = "SELECT 1 FROM events WHERE x"\nstore.pool.fetch(q)\n')
    assert any(_EVENTS_SQL.search(text) for text in _strings(tree))
    assert _pool_uses(tree) == 1
    assert _pool_uses(ast.parse("self.state.store.pool\nx.pool.acquire()\n")) == 2
    assert _pool_uses(ast.parse("agent.pool or default\n")) == 0
    assert not _EVENTS_SQL.search("SELECT 1 FROM events_archive")


TRANSLATING: frozenset[str] = frozenset({"events/log/db.py", "events/log/store.py"})
"""Modules naming ``translate_errors``: where it is defined, and the append, which names its
stream in the errors it translates."""


def test_driver_errors_are_translated_only_in_db_and_the_append() -> None:
    """No module but db.py (and the store's append) wraps calls in ``translate_errors``: every
    connection, pooled connection and cursor the store hands out translates on its own."""
    naming = {
        path.relative_to(ROOT).as_posix()
        for top in ("events", "services", "cairn")
        for path in (ROOT / top).rglob("*.py")
        if "translate_errors" in path.read_text()
    }
    assert naming == TRANSLATING
