"""The PostgreSQL event store: serialized appends with optimistic concurrency, ordered reads.

Invariant: every append takes ``LOCK TABLE events IN EXCLUSIVE MODE`` before inserting, so
positions are assigned and committed in the same order. A reader that has seen position p has
therefore seen every committed event below p; gaps (from rolled-back appends) are never filled
later and are safe to skip. The lock does not block readers.

Appends and the lock go through two functions, ``cairn_append`` and ``cairn_lock_appends``,
that run as :data:`events.log.migrations.LOG_WRITER`: a service's role may execute them and read
``events``, and holds no other right on it (see :mod:`services.roles`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from events.log import append_timing, faults, migrations, origin
from events.log.db import Connection, Pool, acquire, create_pool, translate_errors
from events.log.envelope import (
    Event,
    NewEvent,
    RecordedEvent,
    stored_event,
)
from events.log.errors import ConcurrencyError, EventTooLargeError, FencedError
from events.log.limits import MAX_EVENT_BYTES, encoded, largest_part
from events.log.reads import LogReads, row_to_event
from events.log.registry import encode

NOTIFY_CHANNEL = "cairn_events"
# Taken by a function (migration 0007_append_owner) that runs as the log's writer role: a
# service's own role may not lock the table itself.
_LOCK_APPENDS = "SELECT cairn_lock_appends()"
# One statement appends (migration 0006_append_function): it takes the append lock, checks the
# fence and the expected version, inserts and queues the wake-up.
_APPEND = "SELECT * FROM cairn_append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"

__all__ = ["EventStore", "Fence", "Transaction", "lease_stream", "read_checkpoint", "row_to_event"]


@dataclass(frozen=True)
class Fence:
    """A leader's epoch on a lease; writes carrying a stale fence are rejected."""

    lease: str
    epoch: int


def lease_stream(lease: str) -> str:
    """The stream on which a lease's ``LeaderElected`` events are recorded."""
    return f"lease-{lease}"


def _as_new(item: Event | NewEvent) -> NewEvent:
    return item if isinstance(item, NewEvent) else NewEvent(event=item)


class Transaction(LogReads):
    """A database transaction in which appends, reads, checkpoints and effects commit together.

    The reads of :class:`events.log.reads.LogReads` run in it.

    Attributes:
        conn: the connection the transaction runs on.
        max_event_bytes: the largest event :meth:`append` accepts (payload plus metadata).
        fence: a leader's fence that every append of this transaction carries (its epoch is
            stamped on each event) and is checked against; see :meth:`write_as`.
    """

    def __init__(
        self,
        conn: Connection,
        *,
        max_event_bytes: int = MAX_EVENT_BYTES,
        in_transaction: bool = True,
    ) -> None:
        self.conn = conn
        self.max_event_bytes = max_event_bytes
        self.fence: Fence | None = None
        self._locked = False
        self._fenced: Fence | None = None
        # False only for EventStore.append's single statement, which commits on its own.
        self._in_transaction = in_transaction

    def _reading(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        return contextlib.nullcontext(self.conn)

    def write_as(self, fence: Fence | None) -> None:
        """Makes every later append of this transaction a write of the leader holding ``fence``:
        each event records its epoch, and the append is refused if the epoch is stale."""
        self.fence = fence

    async def lock_appends(self) -> None:
        """Takes the append lock now rather than at the first append (held until commit).

        Nothing can be appended by anyone else between this call and the commit, so a decision
        read from the log after it (e.g. "this uuid is not recorded yet") still holds when this
        transaction appends. Callers that also claim inbox keys take it first, before the claim,
        so two transactions never wait on each other's locks.
        """
        if not self._locked:
            await self.conn.execute(_LOCK_APPENDS)
            self._locked = True

    async def check_fence(self, fence: Fence) -> None:
        """Raises :class:`FencedError` unless ``fence.epoch`` is the lease's latest epoch.

        Checked once per transaction and fence: the append lock, taken here, keeps any newer
        election out until the commit.
        """
        await self.lock_appends()
        if self._fenced == fence:
            return
        current = await self.conn.fetchval(
            "SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = $1",
            lease_stream(fence.lease),
        )
        if current != fence.epoch:
            raise FencedError(fence.lease, fence.epoch, int(current))
        self._fenced = fence

    async def stream_version(self, stream_id: str) -> int:
        """Returns the stream's current version (0 for a stream with no events)."""
        value = await self.conn.fetchval(
            "SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = $1", stream_id
        )
        return int(value)

    async def append(
        self,
        stream_id: str,
        events: Sequence[Event | NewEvent],
        *,
        expected_version: int | None = None,
        fence: Fence | None = None,
    ) -> list[RecordedEvent]:
        """Appends ``events`` to ``stream_id`` atomically with the rest of this transaction.

        Args:
            stream_id: target stream, e.g. ``trial-42``.
            events: payloads (or payloads with ids and metadata) in order.
            expected_version: the version the stream must be at (0: must not exist yet);
                ``None`` appends whatever the version is.
            fence: the writer's leader epoch; a stale one raises :class:`FencedError`
                (default: the transaction's :attr:`fence`).

        Raises:
            EventTooLargeError: an event's encoded payload and metadata exceed
                ``max_event_bytes``; nothing is appended.
            ConcurrencyError: the stream is not at ``expected_version``.
            FencedError: ``fence`` is no longer current.
            DuplicateEventError: an event's ``event_id`` is already in the log.
        """
        if not events:
            return []
        items = [_as_new(e) for e in events]
        fence = fence or self.fence
        epoch = fence.epoch if fence is not None else None
        stamped = [origin.stamp(item.metadata) for item in items]
        metas = [m.model_copy(update={"epoch": epoch}) if epoch else m for m in stamped]
        payloads = [encode(i.event) for i in items]
        payload_texts = [encoded(p) for p in payloads]
        meta_texts = [m.model_dump_json(exclude_none=True) for m in metas]
        for item, payload, text, meta_text in zip(
            items, payloads, payload_texts, meta_texts, strict=True
        ):
            # The payload text is ASCII-escaped JSON, so its characters are bytes; the bus's
            # max_payload is sized from this measure (events.log.limits).
            size = len(text) + len(meta_text.encode())
            if size > self.max_event_bytes:
                meta_size = size - len(text)
                part, part_size = (
                    largest_part(payload) if meta_size <= len(text) else ("metadata", meta_size)
                )
                raise EventTooLargeError(
                    stream_id, item.event.event_type, size, self.max_event_bytes, part, part_size
                )
        check = fence if fence is not None and fence != self._fenced else None
        started = time.perf_counter()
        with translate_errors(stream_id):
            rows = await self.conn.fetch(
                _APPEND,
                stream_id,
                [i.event_id for i in items],
                [i.event.event_type for i in items],
                [i.event.schema_version for i in items],
                payload_texts,
                meta_texts,
                expected_version,
                lease_stream(check.lease) if check is not None else None,
                check.epoch if check is not None else None,
                NOTIFY_CHANNEL,
            )
        self._locked = True  # the statement took the append lock, held until commit
        if check is not None:
            fenced = rows[0]["o_fenced"]
            if fenced is not None:
                raise FencedError(check.lease, check.epoch, int(fenced))
            self._fenced = check
        current = int(rows[0]["o_current"])
        if rows[0]["o_position"] is None:
            raise ConcurrencyError(stream_id, expected_version, current)
        versions = [current + n + 1 for n in range(len(items))]
        by_version = {r["o_version"]: r for r in rows}
        recorded = [
            stored_event(
                {
                    "position": by_version[v]["o_position"],
                    "stream_id": stream_id,
                    "stream_version": v,
                    "event_id": item.event_id,
                    "type": item.event.event_type,
                    "schema_version": item.event.schema_version,
                    "payload": payload,
                    "metadata": meta,
                    "recorded_at": by_version[v]["o_recorded_at"],
                }
            )
            for v, item, payload, meta in zip(versions, items, payloads, metas, strict=True)
        ]
        origin.count_appended(len(recorded))
        append_timing.appended(time.perf_counter() - started, len(recorded))
        if self._in_transaction:
            await faults.point("store.before_commit")
        return recorded

    async def next_trial_id(self) -> int:
        """Takes a new cluster-wide trial id from sequence ``trial_ids`` (never reused; a
        rolled-back transaction leaves a gap)."""
        value = await self.conn.fetchval("SELECT nextval('trial_ids')")
        return int(value)

    async def lock_checkpoint(self, name: str) -> int:
        """Locks consumer ``name``'s checkpoint row until commit and returns its position."""
        await self.conn.execute(
            "INSERT INTO checkpoints (name) VALUES ($1) ON CONFLICT DO NOTHING", name
        )
        value = await self.conn.fetchval(
            "SELECT position FROM checkpoints WHERE name = $1 FOR UPDATE", name
        )
        return int(value)

    async def set_checkpoint(self, name: str, position: int) -> None:
        """Moves consumer ``name``'s checkpoint forward to ``position`` (never backwards)."""
        await self.conn.execute(
            """INSERT INTO checkpoints (name, position) VALUES ($1, $2)
               ON CONFLICT (name) DO UPDATE SET position = excluded.position, updated_at = now()
               WHERE checkpoints.position < excluded.position""",
            name,
            position,
        )

    async def rewind_checkpoint(self, name: str, position: int) -> None:
        """Moves consumer ``name``'s checkpoint back to ``position`` (a checkpoint already at or
        below it stays): for a consumer that learns its effects since ``position`` were lost
        downstream and must be made again, as the relay does when the bus lost its tail."""
        await self.conn.execute(
            """UPDATE checkpoints SET position = $2, updated_at = now()
               WHERE name = $1 AND position > $2""",
            name,
            position,
        )


class EventStore(LogReads):
    """The log: an asyncpg pool plus the append/read operations on it.

    The reads of :class:`events.log.reads.LogReads` each run on a pooled connection.

    Its asyncpg pool is its own: a service reads the log through the reads, writes through
    :meth:`append` and :meth:`transaction`, and reaches its own tables through
    :meth:`connection`, :meth:`transaction` and the one-statement helpers (:meth:`fetch` and
    the like), all of which raise :mod:`events.log.errors` errors only.

    Attributes:
        dsn: where it connects.
        max_event_bytes: the largest event an append accepts (payload plus metadata, encoded);
            :data:`events.log.limits.MAX_EVENT_BYTES` unless told otherwise.
    """

    def __init__(self, pool: Pool, dsn: str, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._pool = pool
        self.dsn = dsn
        self.max_event_bytes = max_event_bytes

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        max_event_bytes: int = MAX_EVENT_BYTES,
        settings: dict[str, str] | None = None,
    ) -> EventStore:
        """Opens a pool on ``dsn`` (sessions with server ``settings``, if given) and applies the
        core migrations."""
        pool = await create_pool(dsn, min_size=min_size, max_size=max_size, settings=settings)
        async with acquire(pool) as conn:
            await migrations.apply(conn, "core", migrations.CORE)
        return cls(pool, dsn, max_event_bytes=max_event_bytes)

    async def close(self) -> None:
        """Closes the pool."""
        with contextlib.suppress(Exception):
            await self._pool.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """Yields a :class:`Transaction` that commits when the block exits without error."""
        async with acquire(self._pool) as conn, conn.transaction():
            yield Transaction(conn, max_event_bytes=self.max_event_bytes)

    @contextlib.asynccontextmanager
    async def read_transaction(self) -> AsyncIterator[Transaction]:
        """Yields a read-only :class:`Transaction` in which every read sees one snapshot of the
        database (``REPEATABLE READ``): a row committed after its first read is never seen."""
        async with (
            acquire(self._pool) as conn,
            conn.transaction(isolation="repeatable_read", readonly=True),
        ):
            yield Transaction(conn, max_event_bytes=self.max_event_bytes)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """Yields a pooled connection for a service's own tables (outside a transaction; see
        :meth:`transaction` for one); its queries, and taking it, raise :mod:`events.log.errors`
        errors only."""
        async with acquire(self._pool) as conn:
            yield conn

    def _reading(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        return self.connection()

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """Runs a query on a pooled connection and returns its rows.

        Raises:
            StoreUnavailableError: the database is unreachable or busy; a retry may succeed.
            StatementError: the database refused the statement.
        """
        async with self.connection() as conn:
            return list(await conn.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        """Runs a query on a pooled connection and returns its first row (or ``None``); errors
        as :meth:`fetch`."""
        async with self.connection() as conn:
            return await conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """Runs a query on a pooled connection and returns the first column of its first row
        (or ``None``); errors as :meth:`fetch`."""
        async with self.connection() as conn:
            return await conn.fetchval(sql, *args)

    async def execute(self, sql: str, *args: Any) -> str:
        """Runs a statement on a pooled connection and returns its status; errors as
        :meth:`fetch`."""
        async with self.connection() as conn:
            return str(await conn.execute(sql, *args))

    async def append(
        self,
        stream_id: str,
        events: Sequence[Event | NewEvent],
        *,
        expected_version: int | None = None,
        fence: Fence | None = None,
    ) -> list[RecordedEvent]:
        """Appends in a transaction of its own; see :meth:`Transaction.append`.

        The append is one statement (lock, fence and version checks, insert, wake-up) run
        outside an explicit transaction, so it commits on its own: one round trip in all.
        """
        if not events:
            return []
        async with acquire(self._pool) as conn:
            tx = Transaction(conn, max_event_bytes=self.max_event_bytes, in_transaction=False)
            return await tx.append(
                stream_id, events, expected_version=expected_version, fence=fence
            )

    async def iter_all(
        self,
        after: int = 0,
        *,
        batch: int = 5000,
        types: Iterable[str] | None = None,
        envelopes: Iterable[str] = (),
    ) -> AsyncIterator[RecordedEvent]:
        """Iterates every committed event after ``after`` in position order, in pages (the
        arguments as in :meth:`~events.log.reads.LogReads.read_all`)."""
        position = after
        type_list = list(types) if types is not None else None
        categories = list(envelopes)
        while True:
            page = await self.read_all(position, limit=batch, types=type_list, envelopes=categories)
            for event in page:
                yield event
            if len(page) < batch:
                return
            position = page[-1].position

    async def stream_version(self, stream_id: str) -> int:
        """Returns the stream's current version (0 for a stream with no events)."""
        async with self.transaction() as tx:
            return await tx.stream_version(stream_id)

    async def checkpoint(self, name: str) -> int:
        """Returns consumer ``name``'s checkpoint (0 if it has none)."""
        async with self.connection() as conn:
            return await read_checkpoint(conn, name)

    async def next_experiment_id(self) -> int:
        """Allocates a new experiment id (ids are never reused; gaps are possible)."""
        value = await self.fetchval("SELECT nextval('experiment_ids')")
        return int(value)


async def read_checkpoint(conn: Any, name: str) -> int:
    """Consumer ``name``'s checkpoint read on ``conn`` (a connection or pool; 0 if it has none),
    for readers that want it in their own transaction."""
    value = await conn.fetchval("SELECT position FROM checkpoints WHERE name = $1", name)
    return int(value or 0)
