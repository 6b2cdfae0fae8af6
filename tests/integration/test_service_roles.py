"""Each service's PostgreSQL role holds only what services.roles declares: it appends only through
the append functions, writes only its owner's tables, and can neither change the schema nor act
as a superuser; `python -m services.migrate` makes the roles on new and older databases alike."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from events.domain.types import ExperimentSubmitted, LeaderElected
from events.log import migrations
from events.log.errors import ConcurrencyError, FencedError, MigrationsPendingError, StatementError
from events.log.store import EventStore, Fence
from services import migrate, roles
from services.api import tables as api_tables
from tests.helpers import wait_until

PERMISSION_DENIED = "42501"


def database_of(dsn: str) -> str:
    """The database a DSN names."""
    return dsn.rsplit("/", 1)[1]


def mode_of(path: Path) -> int:
    """The permission bits of ``path``."""
    return path.stat().st_mode & 0o777


def names_in(directory: Path) -> list[str]:
    """The names in ``directory``, sorted."""
    return sorted(p.name for p in directory.iterdir())


def role_dsn(logins: Path, service: str) -> str:
    """The DSN ``services.migrate`` wrote for ``service``."""
    return (logins / service / migrate.DSN_FILE).read_text().strip()


@pytest.fixture
async def logins(db_url: str, tmp_path: Path) -> AsyncIterator[Path]:
    """A database migrated and granted by ``services.migrate``; yields the login directory."""
    path = tmp_path / "secrets"
    await migrate.run(db_url, path)
    yield path


async def waiting_on_events(store: EventStore) -> bool:
    """Whether some session waits for a lock on ``events`` (an append behind the append lock)."""
    return bool(
        await store.fetchval(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'events'::regclass"
        )
    )


async def refused(dsn: str, sql: str) -> str | None:
    """Runs ``sql`` on ``dsn``; the SQLSTATE it was refused with, or None if it ran."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    except asyncpg.PostgresError as exc:
        return str(exc.sqlstate)
    finally:
        await conn.close()
    return None


async def test_migrate_writes_private_login_files(logins: Path, db_url: str) -> None:
    """Every service with a role gets a 0700 directory holding its password and DSN (0600), the
    DSN logs in as the role named after the database, and no agent directory is made."""
    assert mode_of(logins) == 0o700
    assert names_in(logins) == sorted(r.service for r in roles.SERVICE_ROLES)
    for role in roles.SERVICE_ROLES:
        directory = logins / role.service
        assert mode_of(directory) == 0o700
        for name in (migrate.DSN_FILE, migrate.PASSWORD_FILE):
            assert mode_of(directory / name) == 0o600
        conn = await asyncpg.connect(role_dsn(logins, role.service))
        try:
            user = await conn.fetchval("SELECT current_user")
        finally:
            await conn.close()
        assert user == roles.role_name(database_of(db_url), role.service)


async def test_no_service_role_is_privileged_or_changes_the_schema(
    logins: Path, db_url: str
) -> None:
    """No role is a superuser or may create roles or databases, and none may create a table,
    alter or drop one, or make a temporary table."""
    database = database_of(db_url)
    admin = await asyncpg.connect(db_url)
    try:
        for role in roles.SERVICE_ROLES:
            row = await admin.fetchrow(
                "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication"
                " FROM pg_roles WHERE rolname = $1",
                roles.role_name(database, role.service),
            )
            assert row is not None and not any(row.values()), (role.service, dict(row or {}))
    finally:
        await admin.close()
    for role in roles.SERVICE_ROLES:
        dsn = role_dsn(logins, role.service)
        for sql in (
            "CREATE TABLE intruder (a int)",
            "CREATE TEMPORARY TABLE intruder (a int)",
            "ALTER TABLE events ADD COLUMN forged text",
            "DROP TABLE checkpoints",
            "CREATE FUNCTION cairn_forge() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        ):
            assert await refused(dsn, sql) == PERMISSION_DENIED, (role.service, sql)


async def test_no_service_role_writes_events_directly(logins: Path, store: EventStore) -> None:
    """INSERT, UPDATE, DELETE, TRUNCATE and the append lock on ``events`` are refused to every
    role (permission denied, not some other error), while the superuser may do the same."""
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config={})])
    forged_id = uuid.uuid4()
    writes = (
        "INSERT INTO events (stream_id, stream_version, event_id, type, schema_version, payload)"
        f" VALUES ('experiment-1', 2, '{forged_id}', 'ExperimentSubmitted', 1, '{{}}')",
        "UPDATE events SET payload = '{}' WHERE stream_id = 'experiment-1'",
        "DELETE FROM events WHERE stream_id = 'experiment-1'",
        "TRUNCATE events",
        "BEGIN; LOCK TABLE events IN EXCLUSIVE MODE; COMMIT",
    )
    for role in roles.SERVICE_ROLES:
        for sql in writes:
            assert await refused(role_dsn(logins, role.service), sql) == PERMISSION_DENIED, (
                role.service,
                sql,
            )
    # the same statements are not refused for some other reason: the superuser runs them
    assert await refused(store.dsn, writes[1]) is None
    assert await store.head() == 1


async def test_every_role_appends_through_the_function_with_its_guarantees(
    logins: Path, store: EventStore
) -> None:
    """Each role appends through the store: the expected-version check, the leader fence and the
    append lock (held until commit, so nobody appends meanwhile) all still hold."""
    lease = await store.append("lease-test", [LeaderElected(lease="test", holder="h")])
    fence = Fence("test", lease[-1].stream_version)
    for n, role in enumerate(roles.SERVICE_ROLES, start=1):
        as_role = await EventStore.connect(role_dsn(logins, role.service), max_size=2)
        stream = f"experiment-{n}"
        try:
            done = await as_role.append(
                stream, [ExperimentSubmitted(experiment_id=n, config={})], expected_version=0
            )
            assert done[0].stream_version == 1
            with pytest.raises(ConcurrencyError):
                await as_role.append(
                    stream, [ExperimentSubmitted(experiment_id=n, config={})], expected_version=0
                )
            with pytest.raises(FencedError):
                await as_role.append(
                    stream,
                    [ExperimentSubmitted(experiment_id=n, config={})],
                    fence=Fence("test", fence.epoch + 1),
                )
            async with as_role.transaction() as tx:
                await tx.lock_appends()
                other = asyncio.ensure_future(
                    store.append(stream, [ExperimentSubmitted(experiment_id=n, config={})])
                )
                await wait_until(lambda: waiting_on_events(store), timeout=10)
                assert not other.done(), f"{role.service}: an append passed the held lock"
            await asyncio.wait_for(other, 10)
            assert await store.stream_version(stream) == 2
        finally:
            await as_role.close()


async def test_each_role_writes_only_its_own_tables(logins: Path, db_url: str) -> None:
    """For every relation of every owner, a role may write it only if its package owns it (or
    its declaration names it as a log relation it keeps rows in), and may read another owner's
    table only through a declared read; a write to another owner's table is refused."""
    database = database_of(db_url)
    admin = await asyncpg.connect(db_url)
    try:
        for role in roles.SERVICE_ROLES:
            name = roles.role_name(database, role.service)
            for owner, relations in roles.OWNERS.items():
                for relation in relations:
                    kind = await admin.fetchval(
                        "SELECT relkind FROM pg_class WHERE relname = $1", relation
                    )
                    if kind == "S":
                        may_use = await admin.fetchval(
                            "SELECT has_sequence_privilege($1, $2, 'USAGE')", name, relation
                        )
                        assert may_use == (relation in role.owns or relation in role.sequences), (
                            role.service,
                            relation,
                        )
                        continue
                    may_write = await admin.fetchval(
                        "SELECT has_table_privilege($1, $2, 'INSERT')"
                        " OR has_table_privilege($1, $2, 'UPDATE')"
                        " OR has_table_privilege($1, $2, 'DELETE')",
                        name,
                        relation,
                    )
                    may_read = await admin.fetchval(
                        "SELECT has_table_privilege($1, $2, 'SELECT')", name, relation
                    )
                    writes = relation in role.owns or relation in role.log
                    reads = writes or relation in roles.READ_BY_ALL + role.reads
                    assert may_write == writes, (role.service, owner, relation)
                    assert may_read == reads, (role.service, owner, relation)
    finally:
        await admin.close()
    # what the matrix says, a real statement shows: the scheduler's role may neither read the
    # gateway's credentials nor write the tracker's projections, the gateway's may do both of
    # its own
    scheduler = role_dsn(logins, "scheduler")
    assert await refused(scheduler, "SELECT * FROM api_tokens") == PERMISSION_DENIED
    assert await refused(scheduler, "SELECT * FROM api_secrets") == PERMISSION_DENIED
    assert await refused(scheduler, "DELETE FROM tr_experiments") == PERMISSION_DENIED
    assert await refused(scheduler, "SELECT count(*) FROM agent_heartbeats") is None
    assert await refused(role_dsn(logins, "api"), "DELETE FROM api_tokens") is None
    assert await refused(role_dsn(logins, "tracker"), "DELETE FROM api_users") == (
        PERMISSION_DENIED
    )


async def test_migrate_is_idempotent_and_upgrades_an_older_database(
    db_url: str, tmp_path: Path
) -> None:
    """A database an earlier version made as superuser only (migrations up to the plain append
    function, events in it) is upgraded: its log is kept, the append function runs as the log's
    writer, and running migrate again changes nothing and keeps the passwords."""
    conn = await asyncpg.connect(db_url)
    try:
        old_core = [m for m in migrations.CORE if m[0] <= "0006_append_function"]
        from events.log.db import connect

        translated = await connect(db_url)
        try:
            await migrations.apply(translated, "core", old_core)
            await migrations.apply(translated, api_tables.NAMESPACE, api_tables.MIGRATIONS)
        finally:
            await translated.close()
        await conn.execute(
            "SELECT cairn_append('experiment-7', ARRAY[$1::uuid], ARRAY['ExperimentSubmitted'],"
            " ARRAY[1], ARRAY['{\"experiment_id\": 7, \"config\": {}}'], ARRAY['{}'], 0, NULL,"
            " NULL, 'cairn_events')",
            uuid.uuid4(),
        )
        logins = tmp_path / "secrets"
        await migrate.run(db_url, logins)
        first = (logins / "api" / migrate.PASSWORD_FILE).read_text()
        await migrate.run(db_url, logins)
        assert (logins / "api" / migrate.PASSWORD_FILE).read_text() == first
        owner = await conn.fetchval(
            "SELECT pg_get_userbyid(proowner) FROM pg_proc WHERE proname = 'cairn_append'"
        )
        definer = await conn.fetchval(
            "SELECT prosecdef FROM pg_proc WHERE proname = 'cairn_append'"
        )
        assert (owner, definer) == (migrations.LOG_WRITER, True)
    finally:
        await conn.close()
    as_api = await EventStore.connect(role_dsn(logins, "api"))
    try:
        assert [e.stream_id for e in await as_api.read_all()] == ["experiment-7"]
        await as_api.append(
            "experiment-7", [ExperimentSubmitted(experiment_id=7, config={})], expected_version=1
        )
    finally:
        await as_api.close()


async def test_a_role_stops_on_a_database_missing_migrations(logins: Path, db_url: str) -> None:
    """A service whose owner's migrations are not all applied cannot apply them with its role:
    it stops with an error naming the missing ones and how to apply them."""
    as_api = await EventStore.connect(role_dsn(logins, "api"))
    try:
        newer = [*api_tables.MIGRATIONS, ("9999_future", "CREATE TABLE api_future (a int)")]
        async with as_api.connection() as conn:
            with pytest.raises(MigrationsPendingError) as caught:
                await migrations.apply(conn, api_tables.NAMESPACE, newer)
        assert "api/9999_future" in str(caught.value)
        assert "services.migrate" in str(caught.value)
        # what it would have run is indeed beyond the role
        with pytest.raises(StatementError) as denied:
            await as_api.execute("CREATE TABLE api_future (a int)")
        assert denied.value.sqlstate == PERMISSION_DENIED
    finally:
        await as_api.close()


async def test_a_role_writes_only_its_own_consumers_checkpoints(
    logins: Path, store: EventStore
) -> None:
    """Every role reads every consumer's checkpoint, but writes only its own service's rows: the
    scheduler's role cannot create, move or delete the tracker's audit checkpoint, and the
    tracker's can."""
    async with store.transaction() as tx:
        await tx.set_checkpoint("tracker-audit", 5)
        await tx.set_checkpoint("scheduler", 3)
    scheduler = role_dsn(logins, "scheduler")
    conn = await asyncpg.connect(scheduler)
    try:
        assert (
            await conn.fetchval("SELECT position FROM checkpoints WHERE name = 'tracker-audit'")
            == 5
        )
        moved = await conn.execute(
            "UPDATE checkpoints SET position = 999 WHERE name = 'tracker-audit'"
        )
        assert moved == "UPDATE 0"
        assert await conn.execute(
            "UPDATE checkpoints SET position = 4 WHERE name = 'scheduler'"
        ) == ("UPDATE 1")
    finally:
        await conn.close()
    for forged in (
        "INSERT INTO checkpoints (name) VALUES ('tracker-forged')",
        "DELETE FROM checkpoints WHERE name = 'tracker-audit'",
    ):
        assert await refused(scheduler, forged) == PERMISSION_DENIED, forged
    assert await store.checkpoint("tracker-audit") == 5
    as_tracker = await EventStore.connect(role_dsn(logins, "tracker"), max_size=1)
    try:
        async with as_tracker.transaction() as tx:
            assert await tx.lock_checkpoint("tracker-audit") == 5
            await tx.set_checkpoint("tracker-audit", 6)
    finally:
        await as_tracker.close()
    assert await store.checkpoint("tracker-audit") == 6
