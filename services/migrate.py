"""``python -m services.migrate``: brings a database up to date and gives each service its role.

Run with the superuser's DSN, before the services start (``cairn up`` runs it at every start),
it applies every owner's migrations (:data:`services.roles.MIGRATION_HOMES`), then creates or
updates each service's role with exactly the rights :mod:`services.roles` declares. Services
therefore need no right to change the schema: one that finds a migration missing stops and says
to run this.

With ``--logins DIR`` it also lets each role log in: the password kept in
``DIR/<service>/db.password`` (generated at the first run, mode 0600) is set on the role (as a
SCRAM verifier, so the password itself never reaches the server), and ``DIR/<service>/db`` is
written with the service's DSN, which the service reads through ``CAIRN_DB_FILE``. ``DIR`` and
each ``DIR/<service>`` are mode 0700. Every step is idempotent.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import structlog

from cairn.local.private_files import read_or_create_secret, write_private
from events import settings
from events.log import db, migrations
from events.log import logging as cairn_logging
from events.log.errors import EventsError
from services import credentials, roles

log = structlog.get_logger("migrate")

PASSWORD_FILE = "db.password"
"""A service's role password, in its directory of ``--logins``."""
DSN_FILE = "db"
"""A service's DSN (with its password), in its directory of ``--logins``."""
SCRAM_ITERATIONS = 4096


def scram_verifier(password: str, *, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802, 7677).

    ``ALTER ROLE ... PASSWORD`` takes it in place of the password, which then never travels to
    the server nor into its logs. ``password`` must be ASCII (generated ones are), so SASLprep
    leaves it as it is.
    """
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def service_dsn(superuser_dsn: str, role: str, password: str) -> str:
    """``superuser_dsn`` with ``role`` and ``password`` as its user (same host, database)."""
    parts = urlsplit(superuser_dsn)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def private_dir(path: Path) -> Path:
    """Makes ``path`` (and missing parents) a directory only its owner may enter (0700)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


async def relation_kinds(conn: db.Connection) -> dict[str, str]:
    """Relation of the ``public`` schema -> ``table`` or ``sequence``."""
    rows = await conn.fetch(
        """SELECT c.relname, c.relkind FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S')"""
    )
    return {str(r["relname"]): "sequence" if r["relkind"] == "S" else "table" for r in rows}


async def migrate(conn: db.Connection) -> int:
    """Applies every owner's pending migrations in order; returns how many ran."""
    ran = 0
    for package, homes in roles.MIGRATION_HOMES.items():
        for namespace, steps in homes:
            count = await migrations.apply(conn, namespace, steps)
            if count:
                log.info("migrated", package=package, namespace=namespace, applied=count)
            ran += count
    return ran


async def grant_roles(
    conn: db.Connection, database: str, passwords: dict[str, str] | None = None
) -> None:
    """Makes every service's role exist with its declared rights, in one transaction.

    Args:
        conn: a superuser's connection to ``database``.
        database: the database the roles are for.
        passwords: service -> the password its role logs in with; a service left out keeps
            whatever login it had (a new role cannot log in).
    """
    kinds = await relation_kinds(conn)
    async with conn.transaction():
        for statement in roles.database_statements(database):
            await conn.execute(statement)
        for role in roles.SERVICE_ROLES:
            for statement in roles.role_statements(database, role, kinds):
                await conn.execute(statement)
            password = (passwords or {}).get(role.service)
            if password is not None:
                name = roles.quoted(roles.role_name(database, role.service))
                await conn.execute(f"ALTER ROLE {name} LOGIN PASSWORD '{scram_verifier(password)}'")


def login_passwords(logins: Path) -> dict[str, str]:
    """Service -> its role's password, read from (or generated into) ``logins/<service>``."""
    private_dir(logins)
    return {
        role.service: read_or_create_secret(private_dir(logins / role.service) / PASSWORD_FILE)
        for role in roles.SERVICE_ROLES
    }


def write_dsns(logins: Path, superuser_dsn: str, database: str, passwords: dict[str, str]) -> None:
    """Writes each service's DSN to ``logins/<service>/db`` (mode 0600)."""
    for service, password in passwords.items():
        dsn = service_dsn(superuser_dsn, roles.role_name(database, service), password)
        write_private(logins / service / DSN_FILE, dsn + "\n")


async def run(superuser_dsn: str, logins: Path | None) -> None:
    """Migrates the database ``superuser_dsn`` names and grants the services' roles (and, with
    ``logins``, their passwords and DSN files)."""
    database = urlsplit(superuser_dsn).path.lstrip("/") or "postgres"
    passwords = login_passwords(logins) if logins is not None else None
    conn = await db.connect(superuser_dsn)
    try:
        await migrate(conn)
        await grant_roles(conn, database, passwords)
    finally:
        await conn.close()
    if logins is not None and passwords is not None:
        write_dsns(logins, superuser_dsn, database, passwords)
    log.info("roles granted", database=database, roles=[r.service for r in roles.SERVICE_ROLES])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (1 if the database refused, 2 on bad usage)."""
    parser = argparse.ArgumentParser(prog="python -m services.migrate", description=__doc__)
    parser.add_argument(
        "--db-file", type=Path, default=None, help="file holding the superuser's DSN"
    )
    parser.add_argument(
        "--logins", type=Path, default=None, help="directory of the services' login files"
    )
    parser.add_argument("--log-level", default=settings.LOG_LEVEL.get())
    args = parser.parse_args(argv)
    credentials.make_undumpable()
    cairn_logging.configure("migrate", level=args.log_level)
    try:
        dsn = credentials.secret("CAIRN_DB", args.db_file)
    except credentials.CredentialsError as exc:
        log.error("no database", error=str(exc))
        return 2
    if not dsn:
        log.error("no database: pass --db-file or set CAIRN_DB_FILE (or CAIRN_DB)")
        return 2
    try:
        asyncio.run(run(dsn, args.logins))
    except (EventsError, roles.RoleNameError, KeyError, OSError) as exc:
        log.error("migration failed", error=str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
