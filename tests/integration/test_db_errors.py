"""Driver errors are translated where a connection is acquired, so no query site sees asyncpg's."""

from __future__ import annotations

import uuid

import pytest

from cairn.local.servers import free_port
from events.log import db
from events.log.errors import ConcurrencyError, StatementError, StoreUnavailableError
from events.log.store import EventStore
from tests.helpers import wait_until


async def test_refused_statements_are_statement_errors(store: EventStore) -> None:
    """A missing table and a unique key other than the log's are StatementError, never a 503."""
    with pytest.raises(StatementError) as missing:
        await store.fetch("SELECT * FROM no_such_table")
    assert missing.value.undefined_table

    await store.execute("CREATE TABLE t (k int PRIMARY KEY)")
    await store.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(StatementError) as dup:
        await store.execute("INSERT INTO t VALUES (1)")
    assert not isinstance(dup.value, StoreUnavailableError)
    assert dup.value.constraint == "t_pkey"


async def test_raw_insert_racing_a_stream_version_is_a_concurrency_error(store: EventStore) -> None:
    """A statement that takes an existing (stream, version) names the stream in ConcurrencyError."""
    row = (
        "INSERT INTO events (stream_id, stream_version, event_id, type, schema_version, payload,"
        " metadata) VALUES ($1, 1, $2, 'X', 1, '{}'::jsonb, '{}'::jsonb)"
    )
    await store.execute(row, "trial-7", uuid.uuid4())
    with pytest.raises(ConcurrencyError) as err:
        await store.execute(row, "trial-7", uuid.uuid4())
    assert err.value.stream_id == "trial-7"


async def test_dropped_connection_is_store_unavailable(store: EventStore) -> None:
    """A query on a connection whose backend was terminated raises StoreUnavailableError."""
    conn = await db.connect(store.dsn)
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        assert await store.fetchval("SELECT pg_terminate_backend($1)", pid)
        await wait_until(  # the backend ends a moment after pg_terminate_backend returns
            lambda: _gone(store, pid), timeout=30, detail=lambda: "the backend still runs"
        )
        with pytest.raises(StoreUnavailableError):
            await conn.fetchval("SELECT 1")
    finally:
        conn.terminate()


async def _gone(store: EventStore, pid: int) -> bool:
    return not await store.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)


async def test_pool_growth_against_a_dead_server_is_store_unavailable() -> None:
    """Opening a pool connection to a port nobody listens on raises StoreUnavailableError."""
    with pytest.raises(StoreUnavailableError):
        await db.create_pool(f"postgresql://cairn@127.0.0.1:{free_port()}/none", min_size=1)


async def test_dedicated_connections_translate_too(store: EventStore) -> None:
    """A connection from ``db.connect`` (leases, LISTEN) translates its errors as well."""
    conn = await db.connect(store.dsn)
    try:
        with pytest.raises(StatementError):
            await conn.execute("SELECT * FROM no_such_table")
    finally:
        await conn.close()
