"""The store is sealed: services read the log only through the store's reads (which upcast at
the boundary) and never hold its connection pool; what is not sealed yet is listed here."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("services", "cairn")

_EVENTS_SQL = re.compile(r"\b(?:FROM|JOIN)\s+(?:ONLY\s+)?events\b(?!\s*\()")

POOL_ALLOWED: dict[str, int] = {
    "services/api/agent_credentials.py": 5,
    "services/api/auth.py": 15,
    "services/api/projections_read.py": 11,
    "services/api/routes_audit.py": 1,
    "services/api/routes_cluster.py": 3,
    "services/api/routes_master.py": 2,
    "services/api/routes_series.py": 1,
    "services/api/routes_trials.py": 1,
    "services/api/routes_unmanaged.py": 2,
    "services/api/routes_usage.py": 1,
    "services/api/tables.py": 5,
    "services/api/tokens.py": 5,
    "services/scheduler/planner.py": 2,
    "services/searcher/custom_worker.py": 1,
    "services/tracker/audit.py": 1,
    "services/tracker/schema.py": 1,
}
"""Module -> uses of an ``EventStore``'s raw pool (to be replaced by the store's narrower
handles)."""


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
        pool[rel] += sum(
            1 for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "pool"
        )
    return +sql, +pool


def test_no_service_reads_the_events_table_with_sql() -> None:
    """No module under services/ or cairn/ holds SQL reading ``events``: the store's reads do."""
    sql, _ = _found()
    assert dict(sql) == {}


def test_no_service_uses_the_store_pool_beyond_the_allow_list() -> None:
    """Every ``.pool`` use under services/ and cairn/ is one the allow-list names."""
    _, pool = _found()
    assert dict(pool) == POOL_ALLOWED


def test_the_scan_sees_a_read_of_events_and_a_pool() -> None:
    """The scan is not vacuous: a synthetic module reading ``events`` and a pool is caught."""
    tree = ast.parse('q = "SELECT 1 FROM events WHERE x"\nstore.pool.fetch(q)\n')
    assert any(_EVENTS_SQL.search(text) for text in _strings(tree))
    assert any(isinstance(n, ast.Attribute) and n.attr == "pool" for n in ast.walk(tree))
    assert not _EVENTS_SQL.search("SELECT 1 FROM events_archive")
