"""Projections commit without waiting for the WAL flush; a SIGKILL of PostgreSQL right after
their commits loses nothing of the log, and the tables come back equal to a rebuild."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import asyncpg

from cairn.local.servers import ServerProcess, start_postgres
from events.log.consumer import Consumer, ConsumerRunner
from events.log.envelope import RecordedEvent
from events.log.store import EventStore, Transaction
from services.tracker import audit, projections, schema
from services.tracker.audit import AuditConsumer
from services.tracker.projections import ProjectionsConsumer
from services.tracker.usage import UsageConsumer
from tests.fault.test_tracker_kill import POINTS, seed
from tests.integration.test_tracker import snapshot

DATABASE = "projections"


async def _connect(server: ServerProcess) -> EventStore:
    """The event store on database :data:`DATABASE` of ``server`` (created if missing)."""
    conn = await asyncpg.connect(server.url)
    try:
        if not await conn.fetchval("SELECT true FROM pg_database WHERE datname = $1", DATABASE):
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()
    return await EventStore.connect(server.url.rsplit("/", 1)[0] + f"/{DATABASE}")


class SettingProbe(Consumer):
    """Records the ``synchronous_commit`` its page transactions run under."""

    name = "setting-probe"

    def __init__(self, *, projection: bool) -> None:
        self.projection = projection
        self.seen: set[str] = set()

    async def handle_page(self, tx: Transaction, events: Sequence[RecordedEvent]) -> None:
        self.seen.add(str(await tx.conn.fetchval("SHOW synchronous_commit")))


def test_only_the_trackers_projections_are_marked_projections() -> None:
    """The audit, usage and projections consumers commit asynchronously; the base consumer
    (deciders, the GC which deletes files) keeps the durable default."""
    assert ProjectionsConsumer.projection and AuditConsumer.projection
    assert UsageConsumer.projection
    assert not Consumer.projection


async def test_projection_pages_commit_asynchronously_and_others_do_not(db_url: str) -> None:
    """On a database that commits durably, a projection's page transaction runs with
    ``synchronous_commit = off`` and any other consumer's with ``on``; the setting ends with
    the transaction."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            f'ALTER DATABASE "{db_url.rsplit("/", 1)[-1]}" SET synchronous_commit = on'
        )
    finally:
        await conn.close()
    store = await EventStore.connect(db_url)
    try:
        await seed(store)
        fast, durable = SettingProbe(projection=True), SettingProbe(projection=False)
        durable.name = "setting-probe-durable"
        await ConsumerRunner(store, None, fast).catch_up()
        await ConsumerRunner(store, None, durable).catch_up()
        assert fast.seen == {"off"}
        assert durable.seen == {"on"}
        assert await store.fetchval("SHOW synchronous_commit") == "on"
    finally:
        await store.close()


async def test_postgres_killed_after_projection_commits_restarts_equal_to_a_rebuild(
    tmp_path: Path,
) -> None:
    """Durable PostgreSQL SIGKILLed right after the projections' last asynchronous commit
    recovers with every event; one more catch-up gives tables equal to a rebuild, and every
    training point is there once."""
    server = start_postgres(tmp_path / "pg", fast=False)
    try:
        store = await _connect(server)
        await schema.migrate(store)
        await audit.migrate(store)
        await seed(store)
        head = await store.head()
        for consumer in (ProjectionsConsumer(), AuditConsumer(), UsageConsumer()):
            await ConsumerRunner(store, None, consumer).catch_up()
        await store.close()
        server.kill()
        assert not server.alive()
    finally:
        server.kill()
    server = start_postgres(tmp_path / "pg", fast=False)
    try:
        assert "automatic recovery in progress" in server.log_path.read_text(errors="replace")
        store = await _connect(server)
        try:
            assert await store.head() == head, "the log survived whole"
            assert await store.checkpoint(projections.NAME) <= head
            for consumer in (ProjectionsConsumer(), AuditConsumer(), UsageConsumer()):
                await ConsumerRunner(store, None, consumer).catch_up()
            assert await store.checkpoint(projections.NAME) == head
            live = await snapshot(store)
            trail = await store.fetch("SELECT * FROM audit_trail ORDER BY position")
            assert sum(1 for r in live["tr_metrics"] if r["group"] == "training") == POINTS
            await projections.rebuild(store)
            await audit.rebuild(store)
            assert await snapshot(store) == live
            assert await store.fetch("SELECT * FROM audit_trail ORDER BY position") == trail
            assert len(trail) == head
        finally:
            await store.close()
    finally:
        server.stop()
