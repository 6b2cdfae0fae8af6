"""The log's reads: every query of the ``events`` table a service needs, in one place.

Invariant: every event a read returns went through :func:`row_to_event`, so its payload is
upcast to its type's current schema version here, the read boundary; a caller never sees a raw
row. A predicate may look into the stored payload (``payload->>'trial_id'``) where an index of
the core migrations is keyed on that expression, but what comes back is the upcast event.

:class:`LogReads` is mixed into :class:`events.log.store.EventStore` (each read on a pooled
connection of its own) and :class:`events.log.store.Transaction` (each read in the
transaction), so a caller reads the same way in or out of a transaction. Driver errors are
translated by :mod:`events.log.db` (its connections, and :func:`events.log.db.translated` for
a cursor).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from events.log.db import Connection, translated
from events.log.envelope import RecordedEvent, stored_event, stored_metadata
from events.log.registry import to_current

COLUMNS = (
    "position, stream_id, stream_version, event_id, type, schema_version, payload, metadata, "
    "recorded_at"
)
"""The columns of ``events`` a :class:`RecordedEvent` is built from, in table order."""

LIFECYCLE_TYPES: tuple[str, ...] = (
    "ExperimentSubmitted",
    "ExperimentStateChanged",
    "ExperimentContinued",
    "SlotsAllocated",
    "TrialExited",
    "TrialStateChanged",
)
"""The types the partial index ``events_lifecycle`` (core migration 0005) covers."""

# The literal list makes the planner prove the partial index's predicate; a parameter could
# not. Kept equal to LIFECYCLE_TYPES (a unit test checks).
_LIFECYCLE_PREDICATE = (
    "type IN ('ExperimentSubmitted', 'ExperimentStateChanged', 'ExperimentContinued',"
    " 'SlotsAllocated', 'TrialExited', 'TrialStateChanged')"
)


def row_to_event(row: Any) -> RecordedEvent:
    """A ``RecordedEvent`` from a row of the ``events`` table (columns as in :data:`COLUMNS`).

    Its payload is upcast to the type's current schema version here, the read boundary, so
    every fold sees one shape of each type whatever version the log holds.
    """
    # Rows come from our own table, written through ``append``: constructing without
    # re-validation is safe and is most of the cost of a replay saved.
    version, payload = to_current(row["type"], row["schema_version"], row["payload"])
    return stored_event(
        {
            "position": row["position"],
            "stream_id": row["stream_id"],
            "stream_version": row["stream_version"],
            "event_id": row["event_id"],
            "type": row["type"],
            "schema_version": version,
            "payload": payload,
            "metadata": stored_metadata(row["metadata"]),
            "recorded_at": row["recorded_at"],
        }
    )


RECORDING_SLACK = timedelta(minutes=1)
"""How far past a moment :meth:`LogReads.position_at` looks for an event recorded by it: an
appending transaction's start (its events' ``recorded_at``) precedes its insert by less."""


async def _bisect_time(conn: Connection, moment: datetime) -> int:
    """The last position whose event was recorded by ``moment`` (0 if none), on the premise that
    ``recorded_at`` grows with ``position``: a bisection over positions with the invariant that
    ``low`` is 0 or an event recorded by ``moment`` and no event at or above ``high`` is."""
    head = await conn.fetchrow(
        "SELECT position, recorded_at FROM events ORDER BY position DESC LIMIT 1"
    )
    if head is None:
        return 0
    if head["recorded_at"] <= moment:
        return int(head["position"])
    low, high = 0, int(head["position"])
    while high - low > 1:
        middle = (low + high) // 2
        row = await conn.fetchrow(
            """SELECT position, recorded_at FROM events
               WHERE position >= $1 AND position < $2 ORDER BY position LIMIT 1""",
            middle,
            high,
        )
        if row is None:  # a gap: nothing in [middle, high)
            high = middle
        elif row["recorded_at"] <= moment:
            low = int(row["position"])
        else:
            high = int(row["position"])
    return low


class LogReads:
    """The reads of the log (see the module doc)."""

    def _reading(self) -> contextlib.AbstractAsyncContextManager[Connection]:
        """The connection a read runs on (the transaction's, or one from the pool)."""
        raise NotImplementedError

    async def read_all(
        self,
        after: int = 0,
        *,
        upto: int | None = None,
        limit: int = 1000,
        types: Iterable[str] | None = None,
        envelopes: Iterable[str] = (),
    ) -> list[RecordedEvent]:
        """Reads committed events with ``after < position <= upto`` in position order.

        Args:
            after: read positions above this one.
            upto: read positions up to this one (``None``: the head).
            limit: at most this many events.
            types: event types to read (``None``: all).
            envelopes: stream types (``trial``, ``agent``, ...) whose events of other types are
                read too, as envelopes with an empty payload: enough for a reader to know each
                of those streams' versions without paying for payloads it does not fold.
        """
        type_list = sorted(set(types)) if types is not None else None
        categories = sorted(set(envelopes))
        async with self._reading() as conn:
            if type_list is None or not categories:
                rows = await conn.fetch(
                    f"""SELECT {COLUMNS} FROM events
                        WHERE position > $1 AND ($2::bigint IS NULL OR position <= $2)
                          AND ($3::text[] IS NULL OR type = ANY($3))
                        ORDER BY position LIMIT $4""",
                    after,
                    upto,
                    type_list,
                    limit,
                )
            else:
                rows = await conn.fetch(
                    """SELECT position, stream_id, stream_version, event_id, type, schema_version,
                              CASE WHEN type = ANY($3) THEN payload ELSE '{}'::jsonb END
                                  AS payload,
                              metadata, recorded_at
                       FROM events
                       WHERE position > $1 AND ($2::bigint IS NULL OR position <= $2)
                         AND (type = ANY($3) OR split_part(stream_id, '-', 1) = ANY($5))
                       ORDER BY position LIMIT $4""",
                    after,
                    upto,
                    type_list,
                    limit,
                    categories,
                )
        return [row_to_event(r) for r in rows]

    async def read_stream(self, stream_id: str, after_version: int = 0) -> list[RecordedEvent]:
        """Reads one stream's events after ``after_version`` in version order."""
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT {COLUMNS} FROM events WHERE stream_id = $1 AND stream_version > $2
                    ORDER BY stream_version""",
                stream_id,
                after_version,
            )
        return [row_to_event(r) for r in rows]

    async def head(self) -> int:
        """The highest committed position (0 for an empty log)."""
        async with self._reading() as conn:
            value = await conn.fetchval("SELECT coalesce(max(position), 0) FROM events")
        return int(value)

    async def consumer_positions(self) -> tuple[int, dict[str, int]]:
        """The head of the log and every consumer's checkpoint, read in one statement (so a
        consumer's lag, head minus checkpoint, is never negative from two moments' reads)."""
        async with self._reading() as conn:
            rows = await conn.fetch(
                """SELECT (SELECT coalesce(max(position), 0) FROM events) AS head,
                          name, position FROM checkpoints
                   UNION ALL SELECT (SELECT coalesce(max(position), 0) FROM events), NULL, NULL
                   ORDER BY name NULLS FIRST"""
            )
        head = int(rows[0]["head"])
        return head, {str(r["name"]): int(r["position"]) for r in rows if r["name"] is not None}

    async def position_at(self, moment: datetime) -> int:
        """The last position recorded at or before ``moment`` (0 if none was).

        Found without a scan and without an index of its own: positions grow with time, so a
        bisection over positions (each step one probe of the primary key) finds the last event
        recorded by ``moment``; about 24 probes on a log of 10M events. Times are the appending
        transactions' start, so a transaction that began before ``moment`` may hold a position
        above one that began after it: the events of the next :data:`RECORDING_SLACK` are
        checked too, and the answer is the last position recorded by ``moment`` among them.
        """
        async with self._reading() as conn:
            last = await _bisect_time(conn, moment)
            bound = await _bisect_time(conn, moment + RECORDING_SLACK)
            if bound > last:
                late = await conn.fetchval(
                    """SELECT max(position) FROM events
                       WHERE position > $1 AND position <= $2 AND recorded_at <= $3""",
                    last,
                    bound,
                    moment,
                )
                last = max(last, int(late or 0))
        return last

    async def read_types(
        self, types: Iterable[str], *, after: int = 0, upto: int | None = None
    ) -> list[RecordedEvent]:
        """Every event of ``types`` with ``after < position <= upto``, in position order.

        Unpaged (index ``events_type_position``): for a few types over a bounded range, such as
        the exits since a fold's position or the cluster's facts up to a moment.

        Args:
            types: the event types to read.
            after: read positions above this one.
            upto: read positions up to this one (``None``: the head).
        """
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT {COLUMNS} FROM events
                    WHERE type = ANY($1::text[]) AND position > $2
                      AND ($3::bigint IS NULL OR position <= $3)
                    ORDER BY position""",
                sorted(set(types)),
                after,
                upto,
            )
        return [row_to_event(r) for r in rows]

    async def read_streams(
        self, stream_ids: Sequence[str], types: Iterable[str]
    ) -> list[RecordedEvent]:
        """The events of ``types`` in any of ``stream_ids``, in position order."""
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT {COLUMNS} FROM events
                    WHERE stream_id = ANY($1::text[]) AND type = ANY($2::text[])
                    ORDER BY position""",
                list(stream_ids),
                sorted(set(types)),
            )
        return [row_to_event(r) for r in rows]

    async def read_lifecycle(self, stream_ids: Sequence[str]) -> list[RecordedEvent]:
        """The lifecycle facts (:data:`LIFECYCLE_TYPES`) of ``stream_ids``, in position order,
        read through the partial index ``events_lifecycle`` (never a scan of the streams)."""
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT {COLUMNS} FROM events
                    WHERE stream_id = ANY($1::text[]) AND {_LIFECYCLE_PREDICATE}
                    ORDER BY position""",
                list(stream_ids),
            )
        return [row_to_event(r) for r in rows]

    async def latest_lifecycle(
        self, stream_id: str, types: Iterable[str], *, limit: int
    ) -> list[RecordedEvent]:
        """The newest ``limit`` events of ``types`` in ``stream_id``, newest first, read through
        the partial index ``events_lifecycle``.

        Raises:
            ValueError: a type is not one of :data:`LIFECYCLE_TYPES` (the index has no rows of it).
        """
        wanted = sorted(set(types))
        if not set(wanted) <= set(LIFECYCLE_TYPES):
            raise ValueError(
                f"latest_lifecycle reads only {', '.join(LIFECYCLE_TYPES)}; "
                f"not {', '.join(sorted(set(wanted) - set(LIFECYCLE_TYPES)))}"
            )
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT {COLUMNS} FROM events
                    WHERE stream_id = $1 AND {_LIFECYCLE_PREDICATE} AND type = ANY($2::text[])
                    ORDER BY position DESC LIMIT $3""",
                stream_id,
                wanted,
                limit,
            )
        return [row_to_event(r) for r in rows]

    async def read_stream_facts(
        self,
        stream_id: str,
        types: Iterable[str],
        *,
        after_version: int = 0,
        requested_trial: str | None = None,
        at: int | None = None,
    ) -> tuple[list[RecordedEvent], int]:
        """One stream's events of ``types`` after ``after_version``, and its head version, in
        one statement.

        Args:
            stream_id: the stream.
            types: event types wanted.
            after_version: read only events above this version.
            requested_trial: when set, ``TrialRequested`` events whose stored ``trial_id`` is
                another label are skipped.
            at: when set, the stream as it was at this log position (events and head up to it).

        Returns:
            The events in version order and the stream's version (0: no such stream).
        """
        async with self._reading() as conn:
            rows = await conn.fetch(
                """SELECT h.head, e.position, e.stream_id, e.stream_version, e.event_id, e.type,
                          e.schema_version, e.payload, e.metadata, e.recorded_at
                   FROM (SELECT coalesce(max(stream_version), 0) AS head
                         FROM events WHERE stream_id = $1
                          AND ($5::bigint IS NULL OR position <= $5)) AS h
                   LEFT JOIN events e
                     ON e.stream_id = $1 AND e.stream_version > $2 AND e.type = ANY($3::text[])
                    AND ($4::text IS NULL OR e.type <> 'TrialRequested'
                         OR e.payload->>'trial_id' = $4)
                    AND ($5::bigint IS NULL OR e.position <= $5)
                   ORDER BY e.stream_version""",
                stream_id,
                after_version,
                list(types),
                requested_trial,
                at,
            )
        head = int(rows[0]["head"]) if rows else 0
        return [row_to_event(r) for r in rows if r["position"] is not None], head

    async def trial_request(self, trial_label: str) -> RecordedEvent | None:
        """The first ``TrialRequested`` whose stored ``trial_id`` is ``trial_label`` (the text
        the log holds: ``17``, legacy ``9.1``), by index ``events_trial_requested``."""
        async with self._reading() as conn:
            row = await conn.fetchrow(
                f"""SELECT {COLUMNS} FROM events
                    WHERE type = 'TrialRequested' AND payload->>'trial_id' = $1
                    ORDER BY position LIMIT 1""",
                trial_label,
            )
        return None if row is None else row_to_event(row)

    async def submission_with_code(self, code_ref: str, *, owner: str) -> RecordedEvent | None:
        """The first ``ExperimentSubmitted`` of ``owner`` whose stored ``code_ref`` is
        ``code_ref`` (None if they submitted none with it)."""
        async with self._reading() as conn:
            row = await conn.fetchrow(
                f"""SELECT {COLUMNS} FROM events WHERE type = 'ExperimentSubmitted'
                    AND payload->>'code_ref' = $1 AND payload->>'owner' = $2
                    ORDER BY position LIMIT 1""",
                code_ref,
                owner,
            )
        return None if row is None else row_to_event(row)

    async def checkpoint_uses(self, uuids: Sequence[str]) -> list[RecordedEvent]:
        """The events that start from one of the checkpoints ``uuids``: each ``TrialStarted``
        restoring one, and each ``ExperimentSubmitted`` naming one as its config's
        ``searcher.source_checkpoint_uuid``, in position order."""
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT {COLUMNS} FROM events
                    WHERE type = 'TrialStarted' AND payload->>'restored_checkpoint' = ANY($1::text[])
                    UNION ALL
                    SELECT {COLUMNS} FROM events
                    WHERE type = 'ExperimentSubmitted'
                      AND payload->'config'->'searcher'->>'source_checkpoint_uuid'
                          = ANY($1::text[])
                    ORDER BY position""",
                list(uuids),
            )
        return [row_to_event(r) for r in rows]

    async def max_model_id(self) -> int:
        """The highest ``model_id`` any ``ModelCreated`` took (0: none), through the type index
        ``events_type_position`` (the scan covers the registry's creations only)."""
        async with self._reading() as conn:
            value = await conn.fetchval(
                """SELECT coalesce(max((payload->>'model_id')::bigint), 0) FROM events
                   WHERE type = 'ModelCreated'"""
            )
        return int(value)

    async def live_registrations(
        self, *, uuids: Sequence[str] = (), experiment_id: int | None = None
    ) -> list[RecordedEvent]:
        """The ``ModelVersionRegistered`` events still in force (neither their version nor their
        model deleted since) that point at one of ``uuids`` or at a checkpoint of experiment
        ``experiment_id``, in position order.

        Read through the type index ``events_type_position``: the scan covers the registry's
        registrations only; each one's deletion is looked up by its stream (the primary key).
        """
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT {COLUMNS} FROM events r
                    WHERE r.type = 'ModelVersionRegistered'
                      AND (r.payload->>'checkpoint_uuid' = ANY($1::text[])
                           OR r.payload->>'experiment_id' = $2::text)
                      AND NOT EXISTS (
                          SELECT 1 FROM events d
                          WHERE d.stream_id = r.stream_id AND d.stream_version > r.stream_version
                            AND (d.type = 'ModelDeleted'
                                 OR (d.type = 'ModelVersionDeleted'
                                     AND d.payload->>'version' = r.payload->>'version')))
                    ORDER BY r.position""",
                list(uuids),
                None if experiment_id is None else str(experiment_id),
            )
        return [row_to_event(r) for r in rows]

    async def latest_per_stream(self, prefix: str, types: Iterable[str]) -> list[RecordedEvent]:
        """The newest event of ``types`` in each stream whose id starts with ``prefix``, in
        stream order."""
        async with self._reading() as conn:
            rows = await conn.fetch(
                f"""SELECT DISTINCT ON (stream_id) {COLUMNS} FROM events
                    WHERE stream_id LIKE $1 AND type = ANY($2::text[])
                    ORDER BY stream_id, stream_version DESC""",
                _like_prefix(prefix),
                sorted(set(types)),
            )
        return [row_to_event(r) for r in rows]

    async def cursor(
        self,
        after: int,
        *,
        types: Sequence[str] | None = None,
        streams: Sequence[str] | None = None,
        named_streams: Sequence[str] | None = None,
        named_categories: Sequence[str] = (),
        limit: int,
        prefetch: int = 100,
    ) -> AsyncGenerator[RecordedEvent, None]:
        """Iterates the events after ``after`` in position order, fetched ``prefetch`` rows at
        a time, so a reader may stop early without reading the rest of ``limit``. Only in a
        transaction (a cursor needs one): see :meth:`events.log.store.EventStore.read_transaction`.

        Args:
            after: read positions above this one.
            types: only these types (``None``: all).
            streams: only these streams (``None``: all).
            named_streams: with ``named_categories``, a second filter: only these streams or
                streams of these categories (``None``: no such filter).
            named_categories: stream categories (``trial``, ``agent``) ``named_streams`` admits.
            limit: at most this many events.
            prefetch: rows fetched per round trip.
        """
        async with self._reading() as conn:
            rows = conn.cursor(
                f"""SELECT {COLUMNS} FROM events
                    WHERE position > $1 AND ($2::text[] IS NULL OR type = ANY($2))
                      AND ($3::text[] IS NULL OR stream_id = ANY($3))
                      AND ($5::text[] IS NULL OR stream_id = ANY($5)
                           OR split_part(stream_id, '-', 1) = ANY($6))
                    ORDER BY position LIMIT $4""",
                after,
                None if types is None else list(types),
                None if streams is None else list(streams),
                limit,
                None if named_streams is None else list(named_streams),
                list(named_categories),
                prefetch=prefetch,
            )
            async for row in translated(rows):
                yield row_to_event(row)


def _like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"
