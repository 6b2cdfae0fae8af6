"""Routes decide nothing: a ``routes_*`` module appends to the log only through
:func:`services.api.decided.append_decided` the events a decider returned, stamps no event
metadata itself and holds no decide/build closure; and a decider (``events.domain.deciders``)
is pure: it imports no I/O, no clock and no randomness, and so is a fold
(``events.domain.aggregates``). Synthetic sources show each rule can
fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROUTES = sorted((ROOT / "services" / "api").glob("routes_*.py"))
DECIDERS = sorted((ROOT / "events" / "domain" / "deciders").glob("*.py"))
FOLDS = sorted((ROOT / "events" / "domain" / "aggregates").glob("*.py"))

DECIDER_SOURCES = ("events.domain.deciders", "events.domain.unmanaged")
"""Where the decisions a route appends come from."""

IMPURE = ("asyncio", "random", "uuid", "time", "os", "asyncpg", "aiohttp", "nats", "services")
"""Modules (and packages) a decider may not import: I/O, clocks, randomness, services."""
IMPURE_LOG = ("events.log.store", "events.log.db", "events.log.bus", "events.log.inbox")
IMPURE_CALLS = frozenset({"now", "utcnow", "today", "time", "monotonic", "uuid4", "random"})


def _awaited_appends(tree: ast.AST) -> list[int]:
    """Lines of ``await <anything>.append(...)``: appending to the log is asynchronous, a list's
    ``append`` never is."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Await)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "append"
    ]


def _imported(tree: ast.AST) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from module import name`` and ``(module, "")`` of every
    ``import module``."""
    out: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names]
    return out


def route_problems(source: str) -> list[str]:
    """What in a routes module's ``source`` breaks the rule."""
    tree = ast.parse(source)
    problems = [f"line {line}: appends directly" for line in _awaited_appends(tree)]
    imported = _imported(tree)
    if ("events.log.envelope", "new") in imported:
        problems.append("imports events.log.envelope.new (only services.api.decided stamps)")
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)]
    nested = {
        inner
        for outer in functions
        for inner in ast.walk(outer)
        if inner is not outer and isinstance(inner, ast.AsyncFunctionDef | ast.FunctionDef)
    }
    problems += [
        f"line {inner.lineno}: a {inner.name}() closure in a handler"
        for inner in sorted(nested, key=lambda n: n.lineno)
        if inner.name in ("decide", "build")
    ]
    appends = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "append_decided"
        for n in ast.walk(tree)
    )
    if appends and not any(m.startswith(DECIDER_SOURCES) for m, _ in imported):
        problems.append("appends decided events but imports no decider")
    return problems


def decider_problems(source: str) -> list[str]:
    """What in a decider module's ``source`` is impure."""
    tree = ast.parse(source)
    problems = [
        f"imports {module}"
        for module, _ in _imported(tree)
        if module.split(".")[0] in IMPURE or module.startswith(IMPURE_LOG)
    ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in IMPURE_CALLS:
                problems.append(f"line {node.lineno}: calls {name}()")
        if isinstance(node, ast.Await | ast.AsyncFunctionDef):
            problems.append(f"line {node.lineno}: is asynchronous")
    return problems


@pytest.mark.parametrize("path", ROUTES, ids=lambda p: p.stem)
def test_routes_append_only_decided_events(path: Path) -> None:
    """Every routes module appends only through append_decided what a decider returned."""
    assert route_problems(path.read_text()) == [], path.name


@pytest.mark.parametrize("path", DECIDERS, ids=lambda p: p.stem)
def test_deciders_are_pure(path: Path) -> None:
    """A decider module imports no I/O, clock or randomness and calls none: a time or an id is
    a field of the command."""
    assert decider_problems(path.read_text()) == []


@pytest.mark.parametrize("path", FOLDS, ids=lambda p: p.stem)
def test_folds_are_pure(path: Path) -> None:
    """A fold module (``events.domain.aggregates``) holds to the deciders' rule: no I/O, clock or
    randomness, so the state at a position is the fold of the log up to it."""
    assert decider_problems(path.read_text()) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("async def h(tx):\n    await tx.append('s', [])\n", "appends directly"),
        ("async def h(store):\n    await store.append('s', [])\n", "appends directly"),
        ("from events.log.envelope import new\n", "envelope.new"),
        ("async def h():\n    async def decide(tx):\n        pass\n", "decide() closure"),
        ("def h():\n    def build(t, a):\n        pass\n", "build() closure"),
        ("async def h(tx):\n    await append_decided(tx, 's', [])\n", "imports no decider"),
    ],
)
def test_the_route_rule_catches_a_route_that_decides(source: str, expected: str) -> None:
    """Each route rule fails on a synthetic module that breaks it."""
    assert any(expected in problem for problem in route_problems(source))


def test_the_route_rule_passes_a_list_append_and_a_decided_append() -> None:
    """A list's append and an append of decided events are what routes are allowed."""
    source = (
        "from events.domain.deciders.trial import decide_kill\n"
        "async def h(tx, out):\n    out.append(1)\n    await append_decided(tx, 's', [])\n"
    )
    assert route_problems(source) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import asyncio\n", "imports asyncio"),
        ("from services.api.views import load_trial\n", "imports services.api.views"),
        ("from events.log.store import Transaction\n", "imports events.log.store"),
        ("from datetime import datetime\nx = datetime.now()\n", "calls now()"),
        ("async def f():\n    pass\n", "asynchronous"),
    ],
)
def test_the_purity_rule_catches_an_impure_decider(source: str, expected: str) -> None:
    """Each purity rule fails on a synthetic decider that breaks it."""
    assert any(expected in problem for problem in decider_problems(source))
