"""Which package may import which: the log's code imports no service and no CLI, a service
imports another service only through that service's declared read module, and the CLI imports
services only where declared. Beside the table-ownership test: that one keeps SQL with its
table's owner, this one keeps code with its service (every import is seen, function-level too)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("events", "services", "cairn")

SERVICES = frozenset(p.parent.name for p in (ROOT / "services").glob("*/__main__.py"))
"""The service packages (``python -m services.<name>``); every other module under ``services/``
(``roles``, ``runtime``, ``confine``, ``contracts``, ...) is shared code, no service's."""

READ_MODULES: dict[str, str] = {
    "services.tracker.read": "the tracker's tables as typed rows, for the gateway's queries",
    "services.api.read": "the gateway's tables other services' roles may select",
}
"""The one way into another service: its read module (the contract it keeps for readers)."""

SHARED_IMPORTS: dict[tuple[str, str], str] = {
    ("services.roles", "services.api.read"): "each role's read grants come from its TABLES",
    ("services.roles", "services.api.tables"): "the gateway's owned tables and migrations",
    ("services.roles", "services.tracker.schema"): "the tracker's owned tables and migrations",
    ("services.roles", "services.tracker.audit"): "the audit tables' owner and migrations",
    ("services.roles", "services.tracker.webhooks"): "the webhook tables' owner and migrations",
}
"""Shared modules that import a service's own module: ``services.roles`` derives every role's
grants and the migration list from the owners' declarations (see ``test_table_ownership``)."""

CLI_IMPORTS: dict[tuple[str, str], str] = {
    ("cairn.cli.preview", "services.searcher.local_preview"): (
        "preview-search runs a custom searcher's class on this machine"
    ),
    ("cairn.local.cluster", "services.credentials"): "cairn up writes each service's secrets",
    ("cairn.local.service_credentials", "services.credentials"): "the same, per service",
}
"""What of ``services`` the CLI, Core API and local cluster import, and why."""


def module_of(path: Path) -> str:
    """The dotted module name of a file under the repository (a package is its ``__init__``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of this repository."""
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(module: str, source: str, *, package: bool = False) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``source`` (``from a import b``: ``a.b`` where that
    is a module of this repository, else ``a``), relative ones resolved against ``module``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                yield node.lineno, target if is_module(target) else base


def service_of(module: str) -> str | None:
    """The service package ``module`` belongs to (``None``: not in a service)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "services" and parts[1] in SERVICES else None


def forbidden(importer: str, target: str) -> str | None:
    """Why ``importer`` may not import ``target`` (``None``: it may)."""
    top, into = importer.split(".")[0], target.split(".")[0]
    if into not in SCANNED:
        return None
    if top == "events" and into != "events":
        return "events/ imports no service and no CLI"
    if top == "cairn" and into == "services":
        if (importer, target) in CLI_IMPORTS:
            return None
        return "cairn/ imports services/ only where CLI_IMPORTS declares it"
    if top != "services" or into != "services":
        return None
    mine, theirs = service_of(importer), service_of(target)
    if theirs is None or theirs == mine:
        return None
    if target in READ_MODULES:
        return None
    if mine is None:
        if (importer, target) in SHARED_IMPORTS:
            return None
        return f"shared code imports {theirs}'s internals (declare it in SHARED_IMPORTS)"
    return f"{mine} imports {theirs} other than through its read module ({sorted(READ_MODULES)})"


@functools.cache
def sources() -> tuple[Path, ...]:
    """Every Python file of the scanned packages, in a stable order."""
    return tuple(path for top in SCANNED for path in sorted((ROOT / top).rglob("*.py")))


@functools.cache
def imports_in(path: Path) -> tuple[tuple[int, str], ...]:
    """``(line, module)`` of every import of the file at ``path`` (each file is parsed once)."""
    return tuple(imports_of(module_of(path), path.read_text(), package=path.name == "__init__.py"))


def violations() -> list[str]:
    """Every forbidden import of the repository, as ``path:line: importer -> target (why)``."""
    found = []
    for path in sources():
        module = module_of(path)
        for line, target in imports_in(path):
            why = forbidden(module, target)
            if why is not None:
                found.append(f"{path.relative_to(ROOT)}:{line}: {module} -> {target} ({why})")
    return found


def used() -> set[tuple[str, str]]:
    """Every (importer, target) pair of the repository whose target is under ``services``."""
    return {
        (module_of(path), target)
        for path in sources()
        for _, target in imports_in(path)
        if target.startswith("services.")
    }


def test_no_module_imports_across_a_boundary() -> None:
    """events/ imports nothing of services/ or cairn/; a service imports another only through
    its read module; the CLI and shared code import services only as declared."""
    assert violations() == []


def test_every_declared_exception_is_still_used() -> None:
    """Each allow-list entry names an import that exists, so the lists only ever shrink to
    what the code needs."""
    pairs = used()
    targets = {target for _, target in pairs}
    assert set(READ_MODULES) <= targets, set(READ_MODULES) - targets
    assert set(SHARED_IMPORTS) <= pairs, set(SHARED_IMPORTS) - pairs
    assert set(CLI_IMPORTS) <= pairs, set(CLI_IMPORTS) - pairs


def test_the_services_are_the_packages_with_a_main() -> None:
    """The scan knows every service (a new one is covered without editing this file)."""
    assert {"agent", "api", "relay", "scheduler", "searcher", "tracker"} <= SERVICES
    assert "contracts" not in SERVICES


@pytest.mark.parametrize(
    ("importer", "source", "allowed"),
    [
        ("services.api.routes_x", "from services.tracker import read as tracker_read", True),
        ("services.api.routes_x", "from services.tracker import series", False),
        ("services.api.routes_x", "from services.tracker.usage import usage_report", False),
        ("services.scheduler.service", "from services.api import read", True),
        ("services.scheduler.service", "import services.api.views", False),
        ("services.agent.agent", "from services.api.routes_allocations import x", False),
        ("services.agent.agent", "from services.contracts.agent import SpecResponse", True),
        ("services.api.views", "from services.agent.runtime import RunSpec", False),
        ("services.searcher.service", "def f():\n    from services.tracker import gc\n", False),
        ("services.contracts.agent", "from services.api import tables", False),
        ("services.tracker.read", "from . import series", True),
        ("events.domain.search.preview", "from services.searcher import sandbox", False),
        ("events.log.store", "import cairn.core", False),
        ("events.domain.search", "from events.domain.config import ExperimentConfig", True),
        ("cairn.cli.preview", "from services.searcher.local_preview import LocalAnswers", True),
        ("cairn.cli.preview", "from services.searcher.service import SearcherConsumer", False),
        ("cairn.cli.experiment", "from services.api import read", False),
    ],
)
def test_the_scan_flags_a_new_forbidden_import(importer: str, source: str, allowed: bool) -> None:
    """A forbidden import in any form (``import``, ``from``, inside a function, relative) is
    flagged; the declared ones pass."""
    package = importer in {"events.domain.search"}
    found = [
        forbidden(importer, target) for _, target in imports_of(importer, source, package=package)
    ]
    assert (found != [] and all(why is None for why in found)) is allowed, found
