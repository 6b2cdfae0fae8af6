"""The PostgreSQL role each service connects as, and what it may do there.

Everything is derived from one declaration of who owns which relation, :data:`OWNERS` (each
owning package's relations as its schema module exports them), which the table-ownership test
checks the code against too. :data:`SERVICE_ROLES` adds, per service, the log's shared relations
it writes, the sequences it takes ids from, and the other owners' tables it reads through their
read modules.

Invariant: no role made here is a superuser, may create or alter anything, or holds INSERT,
UPDATE or DELETE on ``events``: it appends only through :data:`events.log.migrations.APPEND_FUNCTIONS`,
which run as :data:`events.log.migrations.LOG_WRITER`. It writes only the relations its package owns
and those named in its :class:`ServiceRole`, and reads, besides those, only :data:`READ_BY_ALL`
and its :attr:`ServiceRole.reads`. Of ``checkpoints`` it writes only its own consumers' rows: a
consumer is named after its service (``scheduler``, ``tracker-audit``; see
:func:`checkpoint_owner`). Agents have no role: they hold no database credential.

This module only decides (SQL text from declarations); :mod:`services.migrate` runs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from events.log import migrations
from services.api import read as api_read
from services.api import tables as api_tables
from services.tracker import audit as tracker_audit
from services.tracker import schema as tracker_schema
from services.tracker import webhooks as tracker_webhooks

OWNERS: dict[str, tuple[str, ...]] = {
    "events": migrations.OWNED_TABLES,
    "services.api": api_tables.OWNED_TABLES,
    "services.tracker": tracker_schema.OWNED_TABLES,
}
"""Owning package -> the relations it owns: only its modules hold SQL naming them, and only its
service's role may write them."""

Migrations = Sequence[tuple[str, str]]

MIGRATION_HOMES: dict[str, tuple[tuple[str, Migrations], ...]] = {
    "events": (("core", migrations.CORE),),
    "services.api": ((api_tables.NAMESPACE, api_tables.MIGRATIONS),),
    "services.tracker": (
        (tracker_schema.NAMESPACE, tracker_schema.MIGRATIONS),
        (tracker_audit.NAMESPACE, tracker_audit.MIGRATIONS),
        (tracker_webhooks.NAMESPACE, tracker_webhooks.MIGRATIONS),
    ),
}
"""Owning package -> its migrations, as ``(namespace, list)``, in the order they are applied."""

READ_BY_ALL: tuple[str, ...] = ("events", "checkpoints", "schema_migrations")
"""What every service reads: the log, the consumers' checkpoints, and which migrations ran (a
service checks at start that its owner's are applied)."""

TABLE_WRITE = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
"""An owner's rights on a table it owns (the tracker truncates its projections to rebuild)."""
SEQUENCE_USE = ("USAGE", "SELECT", "UPDATE")
"""An owner's rights on a sequence it owns."""
LOG_WRITE = ("SELECT", "INSERT", "UPDATE")
"""A service's rights on a shared relation of the log it keeps rows in (its checkpoints)."""


@dataclass(frozen=True)
class ServiceRole:
    """What one service's database role may do beyond :data:`READ_BY_ALL`.

    Attributes:
        service: the service (``python -m services.<service>``).
        package: the package whose :data:`OWNERS` entry it writes (none for a package that
            owns no table).
        log: relations of the log (owned by ``events``) it keeps rows in: checkpoints, inbox.
        sequences: sequences of the log it takes ids from.
        reads: other owners' tables it reads, each through that owner's read module.
    """

    service: str
    package: str
    log: tuple[str, ...] = ()
    sequences: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()

    @property
    def owns(self) -> tuple[str, ...]:
        """The relations its package owns (and it may write)."""
        return OWNERS.get(self.package, ())


SERVICE_ROLES: tuple[ServiceRole, ...] = (
    ServiceRole("relay", "services.relay", log=("checkpoints",)),
    ServiceRole(
        "api",
        "services.api",
        log=("inbox",),
        # trial_ids: the gateway requests the trials of unmanaged experiments (core_v2).
        sequences=("experiment_ids", "trial_ids"),
        reads=tracker_schema.OWNED_TABLES,
    ),
    ServiceRole(
        "searcher",
        "services.searcher",
        log=("checkpoints",),
        sequences=("trial_ids",),
        reads=api_read.TABLES,
    ),
    ServiceRole("scheduler", "services.scheduler", log=("checkpoints",), reads=api_read.TABLES),
    ServiceRole("tracker", "services.tracker", log=("checkpoints",)),
)
"""Every service that connects to the database, with what its role may do."""

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")


class RoleNameError(ValueError):
    """A database name from which no role name can be made."""


def role_name(database: str, service: str) -> str:
    """The role ``service`` connects to ``database`` as: ``<database>_<service>``.

    Roles belong to the whole server, so the database's name keeps the roles of two databases
    on one server (a test's, the cluster's) apart.

    Raises:
        RoleNameError: ``database`` is not lower-case letters, digits and ``_`` (at most 41).
    """
    if not _NAME.fullmatch(database):
        raise RoleNameError(
            f"database name {database!r}: a service's role is named after it, so it must be "
            "lower-case letters, digits and _ (at most 41)"
        )
    return f"{database}_{service}"


def role_of(service: str) -> ServiceRole:
    """The declaration for ``service``.

    Raises:
        KeyError: ``service`` has no database role (the agent, or an unknown name).
    """
    for role in SERVICE_ROLES:
        if role.service == service:
            return role
    raise KeyError(f"service {service!r} has no database role")


def privileges(role: ServiceRole, kinds: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Relation -> the rights ``role`` holds on it.

    Args:
        role: the service.
        kinds: relation -> ``table`` or ``sequence``, for every relation of :data:`OWNERS`.

    Raises:
        KeyError: a relation the role needs is missing from ``kinds`` (not migrated).
    """
    rights: dict[str, set[str]] = {}

    def grant(relation: str, what: Sequence[str]) -> None:
        rights.setdefault(relation, set()).update(what)

    for relation in READ_BY_ALL + role.reads:
        grant(relation, ("SELECT",))
    for relation in role.owns:
        grant(relation, SEQUENCE_USE if kinds.get(relation) == "sequence" else TABLE_WRITE)
    for relation in role.log:
        grant(relation, LOG_WRITE)
    for relation in role.sequences:
        grant(relation, ("USAGE",))
    missing = sorted(set(rights) - set(kinds))
    if missing:
        raise KeyError(f"{role.service}: no such relations (not migrated?): {', '.join(missing)}")
    order = TABLE_WRITE + SEQUENCE_USE
    return {
        relation: tuple(sorted(what, key=order.index)) for relation, what in sorted(rights.items())
    }


def quoted(identifier: str) -> str:
    """``identifier`` as a quoted SQL identifier."""
    return '"' + identifier.replace('"', '""') + '"'


def database_statements(database: str) -> list[str]:
    """What makes ``database`` reachable only by the roles granted it: nobody else may connect
    or make temporary tables, and nobody but its owner creates in its schema."""
    return [
        f"REVOKE ALL ON DATABASE {quoted(database)} FROM PUBLIC",
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
    ]


def role_statements(database: str, role: ServiceRole, kinds: Mapping[str, str]) -> list[str]:
    """The statements that make ``role``'s role exist with exactly its rights in ``database``.

    Idempotent: the role is created if missing, stripped of every right in the schema, then
    granted what :func:`privileges` says. Run in one transaction, a running service never sees
    the gap. Its password is not set here (see :mod:`services.migrate`).
    """
    name = quoted(role_name(database, role.service))
    statements = [
        f"""DO $$
        BEGIN
            CREATE ROLE {name} NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END
        $$""",
        f"ALTER ROLE {name} NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
        "NOINHERIT",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {name}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {name}",
        f"REVOKE ALL ON ALL FUNCTIONS IN SCHEMA public FROM {name}",
        f"GRANT CONNECT ON DATABASE {quoted(database)} TO {name}",
        f"GRANT USAGE ON SCHEMA public TO {name}",
    ]
    statements += [
        f"GRANT EXECUTE ON FUNCTION {function} TO {name}"
        for function in migrations.APPEND_FUNCTIONS
    ]
    for relation, rights in privileges(role, kinds).items():
        kind = "SEQUENCE" if kinds[relation] == "sequence" else "TABLE"
        statements.append(f"GRANT {', '.join(rights)} ON {kind} {quoted(relation)} TO {name}")
    policy = quoted(f"checkpoints_of_{role.service}")
    statements.append(f"DROP POLICY IF EXISTS {policy} ON checkpoints")
    if "checkpoints" in role.log:
        own = f"name = '{role.service}' OR name LIKE '{role.service}-%'"
        statements.append(
            f"CREATE POLICY {policy} ON checkpoints FOR ALL TO {name} USING ({own}) "
            f"WITH CHECK ({own})"
        )
    return statements


def checkpoint_owner(consumer: str) -> str | None:
    """The service whose role may write consumer ``consumer``'s checkpoint row: the one it is
    named after (``tracker`` for ``tracker-audit``), if that service keeps checkpoints."""
    for role in SERVICE_ROLES:
        if "checkpoints" in role.log and (
            consumer == role.service or consumer.startswith(role.service + "-")
        ):
            return role.service
    return None
