"""Each table has one owning package and one migration home, and only its owner's modules hold
SQL naming it: other packages read through the owner's read module or learn from events."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from events.log import migrations
from services import roles

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("events", "services", "cairn")

OWNERS = roles.OWNERS
"""Owning package -> the relations it owns (the declaration the services' roles derive from)."""

MIGRATION_HOMES: dict[str, Sequence[Sequence[tuple[str, str]]]] = {
    package: tuple(steps for _, steps in homes) for package, homes in roles.MIGRATION_HOMES.items()
}
"""Owning package -> its migration lists (one namespace each)."""

MIGRATION_LIST = "services.roles"
"""The one module outside the owners that names every owner's migrations: the list
``python -m services.migrate`` applies, as the superuser, before any service starts."""

EXCLUDED: dict[str, str] = {}
"""Module path -> why it is not scanned yet."""

_CREATE = re.compile(
    r"\bCREATE\s+(?:UNLOGGED\s+)?(TABLE|SEQUENCE)\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?(\w+)", re.I
)
_DROP = re.compile(r"\bDROP\s+(?:TABLE|SEQUENCE)\s+(?:IF\s+EXISTS\s+)?\"?(\w+)", re.I)
_WRITE = r"INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(?:\s+TABLE)?|(?:ALTER|DROP|CREATE)\s+TABLE"
_READ = r"FROM|JOIN"
_NAMED = re.compile(
    rf"\b(?P<verb>{_WRITE}|{_READ})\s+(?:ONLY\s+|IF\s+(?:NOT\s+)?EXISTS\s+)?\"?(?P<name>\w+)"
    r"|\b(?:nextval|currval|setval|to_regclass)\s*\(\s*'(?P<relation>\w+)'",
    re.I,
)


def owner_of() -> dict[str, str]:
    """Relation -> its owning package (asserting no relation has two owners)."""
    owners: dict[str, str] = {}
    for package, names in OWNERS.items():
        for name in names:
            assert name not in owners, f"{name} is owned by {owners[name]} and {package}"
            owners[name] = package
    return owners


def created_by(lists: Sequence[Sequence[tuple[str, str]]]) -> set[str]:
    """The relations the migration lists leave existing (created and not dropped later)."""
    alive: set[str] = set()
    for steps in lists:
        for _, sql in steps:
            for match in re.finditer(rf"{_CREATE.pattern}|{_DROP.pattern}", sql, re.I):
                if match.group(2):
                    alive.add(match.group(2))
                elif match.group(3):
                    alive.discard(match.group(3))
    return alive


@functools.cache
def retired() -> dict[str, str]:
    """Relation -> the package whose migrations created and later dropped it."""
    gone: dict[str, str] = {}
    for package, lists in MIGRATION_HOMES.items():
        alive = created_by(lists)
        for steps in lists:
            for _, sql in steps:
                gone.update((m.group(2), package) for m in _CREATE.finditer(sql))
        for name in alive:
            gone.pop(name, None)
    return gone


def docstrings(tree: ast.AST) -> set[int]:
    """The ``id`` of every docstring node (module, class and function docstrings)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.add(id(value))
    return found


def string_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of each string literal that is not a docstring (f-string parts too)."""
    skip = docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of a file (each file is parsed once for every test here)."""
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def sources() -> tuple[Path, ...]:
    """Every Python file of the scanned packages, in a stable order."""
    return tuple(path for root in SCANNED for path in sorted((ROOT / root).rglob("*.py")))


def module_of(path: Path) -> str:
    """The dotted module name of a file under the repository."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def belongs(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or inside it."""
    return module == package or module.startswith(package + ".")


def trespasses(module: str, text: str, owners: dict[str, str]) -> Iterator[str]:
    """What SQL in ``text`` of ``module`` creates a relation no package owns, or names one
    another package owns."""
    for match in _CREATE.finditer(text):
        name = match.group(2)
        creator = owners.get(name) or retired().get(name)
        if creator is None:
            yield f"{name} (created, but in no package's OWNED_TABLES)"
        elif not belongs(module, creator):
            yield f"{name} (owned by {creator}) in CREATE"
    for match in _NAMED.finditer(text):
        name = match.group("name") or match.group("relation")
        owner = owners.get(name)
        if owner is None or belongs(module, owner):
            continue
        verb = match.group("verb")
        reading = verb is not None and re.fullmatch(_READ, verb, re.I) is not None
        if reading and name in migrations.SHARED_READ:
            preceding = text[: match.start()].rstrip()
            if not re.search(r"\bDELETE$", preceding, re.I):
                continue
        where = verb.split()[0].upper() if verb else "a function call"
        yield f"{name} (owned by {owner}) in {where}"


def violations() -> list[str]:
    """Every SQL literal outside its tables' owner, as ``path:line: what``."""
    owners = owner_of()
    found = []
    for path in sources():
        rel = str(path.relative_to(ROOT))
        if rel in EXCLUDED:
            continue
        module = module_of(path)
        for line, text in string_literals(parsed(path)):
            found.extend(f"{rel}:{line}: {what}" for what in trespasses(module, text, owners))
    return found


MIGRATING = frozenset({"migrate", "migrate_conn", "MIGRATIONS", "MIGRATION", "CORE"})
"""Names through which a schema module's migrations are run."""


def package_of(module: str) -> str | None:
    """The owning package ``module`` is in, if any."""
    return next((p for p in OWNERS if belongs(module, p)), None)


def foreign_migrations(path: Path) -> Iterator[str]:
    """Where the module at ``path`` reaches for another owner's migrations."""
    module = module_of(path)
    tree = parsed(path)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for name in node.names:
                target = f"{node.module}.{name.name}"
                aliases[name.asname or name.name] = target
                owner = package_of(target)
                if name.name in MIGRATING and owner and not belongs(module, owner):
                    yield f"{node.lineno}: imports {target}"
        elif isinstance(node, ast.Import):
            for name in node.names:
                aliases[name.asname or name.name] = name.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in MIGRATING
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            owner = package_of(aliases[node.value.id])
            if owner and not belongs(module, owner):
                yield f"{node.lineno}: {aliases[node.value.id]}.{node.attr}"


def test_each_package_runs_only_its_own_migrations() -> None:
    """No module reaches for another owner's migrations but the list that
    ``services.migrate`` applies before the services start; a service checks its own owner's at
    start (and readers of an owner's tables tolerate their absence)."""
    found = [
        f"{path.relative_to(ROOT)}:{where}"
        for path in sources()
        if module_of(path) != MIGRATION_LIST
        for where in foreign_migrations(path)
    ]
    assert found == []
    assert list(foreign_migrations(ROOT / "services" / "roles.py")), "MIGRATION_LIST is stale"


def test_every_relation_has_one_owner_and_one_migration_home() -> None:
    """The relations each package exports are exactly those its own migrations create, and no
    relation is created by two packages."""
    owner_of()
    homes: dict[str, str] = {}
    for package, lists in MIGRATION_HOMES.items():
        alive = created_by(lists)
        for name in alive:
            assert name not in homes, f"{name} is created by {homes[name]} and {package}"
            homes[name] = package
        declared = set(OWNERS[package]) - {"schema_migrations"}
        assert alive == declared, f"{package}: migrations create {alive}, exports {declared}"


def test_no_module_names_a_table_it_does_not_own() -> None:
    """No SQL string in events/, services/ or cairn/ names another package's table (the log's
    ``events`` table may be read by anyone, never written outside ``events``)."""
    assert violations() == []


def test_the_scan_sees_the_sql_it_forbids() -> None:
    """The scan flags reads, writes, joins and sequence calls on another owner's relations, and
    lets an owner's own SQL and reads of the log pass."""
    owners = owner_of()
    flagged = {
        "SELECT * FROM tr_trials t JOIN agent_heartbeats h USING (agent_id)": 2,
        "INSERT INTO events (stream_id) VALUES ($1)": 1,
        "DELETE FROM events WHERE position > 1": 1,
        "SELECT nextval('trial_ids')": 1,
        "UPDATE inbox SET result = $1": 1,
        "CREATE TABLE IF NOT EXISTS scheduler_cache (k text)": 1,
    }
    for text, count in flagged.items():
        assert len(list(trespasses("services.scheduler.service", text, owners))) == count, text
    assert not list(trespasses("services.tracker.read", "SELECT * FROM tr_trials", owners))
    assert not list(trespasses("services.api.runs", "SELECT 1 FROM events WHERE true", owners))
    assert not list(trespasses("services.api.x", "read from the tracker's tables", owners))


DATABASE_MODULES = frozenset(
    {"asyncpg", "events.log.db", "events.log.store", "events.log.consumer"}
)
"""Modules through which code reaches the database."""


def imported_modules(path: Path) -> set[str]:
    """The modules ``path`` imports (``from a import b``: ``a.b`` where that is a module)."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found.update(name.name for name in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{name.name}" for name in node.names)
    return found


def source_of(module: str) -> Path | None:
    """The file of a module of this repository, if it is one."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_the_cli_uses_services_only_as_libraries() -> None:
    """What ``cairn`` imports of ``services`` (the searcher's local runner of a custom searcher,
    for ``preview-search``) and everything that imports in turn reaches no database, so the CLI
    reads no service's tables."""
    pending = [
        name
        for path in sources()
        if belongs(module_of(path), "cairn")
        for name in imported_modules(path)
        if name.startswith("services.")
    ]
    assert pending, "the CLI imports nothing of services any more: drop this test"
    seen: set[str] = set()
    while pending:
        module = pending.pop()
        path = source_of(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        imports = imported_modules(path)
        assert not imports & DATABASE_MODULES, f"{module} imports {imports & DATABASE_MODULES}"
        pending.extend(m for m in imports if m.split(".")[0] in {"events", "services"})
        parts = module.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # packages run first
    assert "services.searcher.local_preview" in seen


def test_every_exclusion_is_still_needed() -> None:
    """Each module left out of the scan still names another owner's table; once it no longer
    does, its entry in ``EXCLUDED`` must go so the scan covers it."""
    owners = owner_of()
    for rel in EXCLUDED:
        path = ROOT / rel
        stale = f"{rel} is excluded from the scan but no longer needs it: remove it from EXCLUDED"
        assert path.is_file(), stale
        found = [
            what
            for _, text in string_literals(parsed(path))
            for what in trespasses(module_of(path), text, owners)
        ]
        assert found, stale


def reachable(module: str) -> set[str]:
    """The modules of events/ and services/ that ``module`` imports, directly or not."""
    seen: set[str] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        path = source_of(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        pending.extend(m for m in imported_modules(path) if m.split(".")[0] in SCANNED[:2])
        parts = name.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))
    return seen


def test_each_service_role_covers_the_tables_its_code_names() -> None:
    """Every table of another owner that a service's code can reach in SQL is one its role may
    read (``ServiceRole.reads``), so the grants derived from the owners' declaration are
    enough for the code that runs, and no service reaches a table its role cannot."""
    owners = owner_of()
    for role in roles.SERVICE_ROLES:
        named: set[str] = set()
        for module in reachable(f"services.{role.service}.__main__"):
            path = source_of(module)
            assert path is not None
            for _, text in string_literals(parsed(path)):
                for match in _NAMED.finditer(text):
                    name = match.group("name") or match.group("relation")
                    if name in owners and owners[name] != "events":
                        named.add(name)
        foreign = named - set(role.owns)
        assert foreign <= set(role.reads), (role.service, sorted(foreign - set(role.reads)))


def test_the_gateways_read_module_declares_what_it_reads() -> None:
    """``services.api.read.TABLES`` (what reading services' roles may select) is exactly the set
    of the gateway's tables that module's SQL names, so a new read there needs a new grant."""
    from services.api import read as api_read

    path = ROOT / "services" / "api" / "read.py"
    gateway = set(OWNERS["services.api"])
    named = {
        match.group("name") or match.group("relation")
        for _, text in string_literals(parsed(path))
        for match in _NAMED.finditer(text)
    }
    assert named & gateway == set(api_read.TABLES)


def test_every_service_but_the_agent_has_a_database_role() -> None:
    """The services ``cairn up`` starts are exactly those with a declared role, and the agent:
    an agent holds no database credential, and no service starts without its DSN file."""
    from cairn.local.topology import SERVICES

    declared = {role.service for role in roles.SERVICE_ROLES}
    assert set(SERVICES) - {"agent"} == declared
    assert "agent" not in declared


def test_every_consumer_is_named_after_the_service_that_runs_it() -> None:
    """Each consumer's checkpoint name belongs to the service running it (its role may write
    only such rows of ``checkpoints``), so no consumer is left unable to move its checkpoint."""
    from events.log.relay import CHECKPOINT as RELAY
    from services.scheduler.service import SchedulerConsumer
    from services.searcher.service import SearcherConsumer
    from services.tracker import audit, gc, projections, usage

    runs = {
        RELAY: "relay",
        SchedulerConsumer.name: "scheduler",
        SearcherConsumer.name: "searcher",
        projections.NAME: "tracker",
        audit.NAME: "tracker",
        usage.NAME: "tracker",
        gc.NAME: "tracker",
    }
    assert {name: roles.checkpoint_owner(name) for name in runs} == runs
    assert roles.checkpoint_owner("api") is None  # the gateway keeps no checkpoint
