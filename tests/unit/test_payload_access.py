"""Consumers receive decoded events: no service indexes an event's ``payload``.

A service reads a recorded event's fields from its model (``recorded.decode()``,
``recorded.decode_as(Model)``), never from the stored JSON, so a renamed or retyped field is a
type error instead of a ``KeyError`` in production. The raw ``payload`` may be passed on as it
is (serialized for a table or a stream) only by the modules of :data:`ALLOWED`, each with its
reason; even there it is never indexed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = "services"

ALLOWED: dict[str, str] = {
    "services/api/routes_events.py": (
        "the event stream sends each event as its stored JSON, a config event's with its "
        "secrets masked (mask_payload): serialization only"
    ),
    "services/tracker/audit.py": (
        "RequestRejected/RequestAccepted are kept as their JSON in the detail column; an event "
        "this code cannot decode (a newer cairn's type or version) still gets the experiment "
        "and trial ids its JSON names, so the trail never wedges on it"
    ),
}
"""Module -> why it may read a recorded event's raw ``payload`` (never to index it)."""


def _is_payload(node: ast.expr, aliases: set[str]) -> bool:
    """``<x>.payload``, a name ``payload``, or a name bound to ``<x>.payload``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "payload"
    return isinstance(node, ast.Name) and (node.id == "payload" or node.id in aliases)


def _aliases(tree: ast.AST) -> set[str]:
    """Names assigned a ``<x>.payload`` (``p = event.payload``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr == "payload":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def indexings(source: str) -> list[str]:
    """Where ``source`` indexes a payload: ``payload[...]``, ``payload.get(...)``, on
    ``<x>.payload``, a name ``payload`` or an alias of ``<x>.payload``."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Subscript) and _is_payload(node.value, aliases)) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _is_payload(node.func.value, aliases)
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def raw_reads(source: str) -> list[str]:
    """Where ``source`` reads an ``<x>.payload`` attribute at all (to pass it on, or worse)."""
    return sorted(
        (
            f"{node.lineno}: {ast.unparse(node)}"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr == "payload"
        ),
        key=lambda hit: int(hit.split(":")[0]),
    )


def _sources() -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text()
        for path in sorted((ROOT / SCANNED).rglob("*.py"))
    }


def test_no_service_indexes_an_event_payload() -> None:
    """No module under services/ indexes a payload, allowed modules included."""
    found = {module: hits for module, text in _sources().items() if (hits := indexings(text))}
    assert found == {}


def test_only_allowed_modules_read_the_raw_payload() -> None:
    """Only the modules of ALLOWED read ``<x>.payload``, and each still does (no stale entry)."""
    readers = {module for module, text in _sources().items() if raw_reads(text)}
    assert readers == set(ALLOWED)


def test_the_scan_fails_on_a_module_that_indexes_a_payload() -> None:
    """The scan is not vacuous: each way of indexing a payload in a synthetic module is caught,
    and reading a decoded model or passing the payload on is not indexing."""
    violating = """
def handle(event):
    a = event.payload["trial_id"]
    b = event.payload.get("state", "")
    p = event.payload
    c = p["experiment_id"] + p.get("run_id", 1)
    def inner(payload):
        return payload["uuid"]
"""
    hits = indexings(violating)
    assert len(hits) == 5, hits
    assert raw_reads(violating) == ["3: event.payload", "4: event.payload", "5: event.payload"]
    clean = """
def handle(event):
    fact = event.decode_as(TrialExited)
    row = json.dumps(event.payload)
    return fact.allocation_id, fact.model_dump(), row
"""
    assert indexings(clean) == []
    assert raw_reads(clean) == ["4: event.payload"]
