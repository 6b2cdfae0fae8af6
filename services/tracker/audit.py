"""The audit trail: who did what, when and from where, one row per event of the log.

Consumer ``tracker-audit`` projects every event into ``audit_trail`` (migrations namespace
``tracker-audit``): its position, time, type and stream, the actor, request id and remote
address of its metadata (stamped by :mod:`events.log.origin`), and the experiment and trial it
concerns. ``RequestRejected`` and ``RequestAccepted`` (requests that appended nothing else) keep
their payload as ``detail``. Every value comes from the event itself or from earlier events
(``audit_trials`` maps a trial to its experiment), so :func:`rebuild` gives the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import structlog

from events.domain.names import TrialIdError, coerce_trial_id, experiment_of_stream, trial_of_stream
from events.log import migrations
from events.log.consumer import PageConsumer
from events.log.db import Connection
from events.log.envelope import Event, RecordedEvent
from events.log.errors import EventsError, StatementError, UnknownEventError
from events.log.store import EventStore, Transaction
from services.tracker.rebuild import rebuild_consumer

log = structlog.get_logger("tracker")

NAME = "tracker-audit"
NAMESPACE = "tracker-audit"
TABLES = ("audit_trail", "audit_trials")
DETAILED = frozenset({"RequestRejected", "RequestAccepted"})

MIGRATIONS: Sequence[tuple[str, str]] = (
    (
        "0001_audit_trail",
        """
        CREATE TABLE audit_trail (
            position       bigint PRIMARY KEY,
            recorded_at    timestamptz NOT NULL,
            type           text NOT NULL,
            stream_id      text NOT NULL,
            actor          text,
            request_id     text,
            remote         text,
            experiment_id  bigint,
            trial_id       bigint,
            detail         jsonb
        );
        CREATE INDEX audit_trail_actor ON audit_trail (actor, position);
        CREATE INDEX audit_trail_experiment ON audit_trail (experiment_id, position);
        CREATE INDEX audit_trail_type ON audit_trail (type, position);
        CREATE INDEX audit_trail_time ON audit_trail (recorded_at);
        CREATE INDEX audit_trail_request ON audit_trail (request_id);

        CREATE TABLE audit_trials (
            trial_id       bigint PRIMARY KEY,
            experiment_id  bigint NOT NULL
        );
        """,
    ),
)


async def migrate(store: EventStore) -> int:
    """Applies the audit trail's pending migrations; returns how many ran."""
    async with store.connection() as conn:
        return await migrations.apply(conn, NAMESPACE, MIGRATIONS)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return None


def _facts_of(event: RecordedEvent) -> Event | dict[str, Any]:
    """The event decoded; or, for one this code cannot decode (a type or version of a newer
    cairn, a payload its model rejects), its raw JSON, so that the trail still names the
    experiment and trial its fields do and never wedges on it."""
    try:
        return event.decode()
    except UnknownEventError:
        return event.payload  # undecodable only: see the allow-list of test_payload_access


def _field(facts: Event | dict[str, Any], name: str) -> Any:
    """The value of field ``name`` (``experiment_id``, ``trial_id``), ``None`` if it has none:
    the trail reads the ids that events of every type may carry."""
    if isinstance(facts, Event):
        return getattr(facts, name, None)
    return facts.get(name)


def _trial_of(event: RecordedEvent, facts: Event | dict[str, Any]) -> int | None:
    raw = _field(facts, "trial_id")
    if raw is not None:
        try:
            return coerce_trial_id(raw)
        except (TrialIdError, TypeError, ValueError):
            return None
    return trial_of_stream(event.stream_id)


async def apply(conn: Connection, event: RecordedEvent) -> None:
    """Projects one event into ``audit_trail`` (idempotent: a position is written once)."""
    await apply_page(conn, [event])


async def apply_page(conn: Connection, events: Sequence[RecordedEvent]) -> None:
    """Projects a page of events in three statements, with the rows one by one would give.

    A trial's experiment comes from the first ``TrialRequested`` of that trial in the log: one
    already in ``audit_trials`` before this page wins over one in the page, and within the page
    only an earlier event's mapping is visible to a later event, as when applied one at a time.
    """
    if not events:
        return
    decoded = [_facts_of(e) for e in events]
    ids = [(_experiment_of(e, f), _trial_of(e, f)) for e, f in zip(events, decoded, strict=True)]
    needed = sorted({t for x, t in ids if x is None and t is not None})
    stored: dict[int, int] = {}
    if needed:
        rows = await conn.fetch(
            "SELECT trial_id, experiment_id FROM audit_trials WHERE trial_id = ANY($1::bigint[])",
            needed,
        )
        stored = {int(r["trial_id"]): int(r["experiment_id"]) for r in rows}
    in_page: dict[int, int] = {}
    rows_out: list[tuple[Any, ...]] = []
    for event, (experiment_id, trial_id) in zip(events, ids, strict=True):
        if event.type == "TrialRequested" and trial_id is not None and experiment_id is not None:
            in_page.setdefault(trial_id, experiment_id)
        elif experiment_id is None and trial_id is not None:
            experiment_id = stored[trial_id] if trial_id in stored else in_page.get(trial_id)
        meta = event.metadata
        rows_out.append(
            (
                event.position,
                event.recorded_at,
                event.type,
                event.stream_id,
                _text(meta.actor),
                _text(meta.request_id),
                _text(meta.remote),
                experiment_id,
                trial_id,
                # The request's payload passed on as its JSON (serialization, not field access).
                json.dumps(event.payload) if event.type in DETAILED else None,
            )
        )
    if in_page:
        await conn.execute(
            """INSERT INTO audit_trials (trial_id, experiment_id)
               SELECT * FROM unnest($1::bigint[], $2::bigint[])
               ON CONFLICT (trial_id) DO NOTHING""",
            list(in_page),
            list(in_page.values()),
        )
    columns = list(zip(*rows_out, strict=True))
    await conn.execute(
        """INSERT INTO audit_trail (position, recorded_at, type, stream_id, actor, request_id,
                                    remote, experiment_id, trial_id, detail)
           SELECT p, r, t, s, a, q, m, x, tr, d::jsonb
           FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::text[], $5::text[],
                       $6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::text[])
                AS u(p, r, t, s, a, q, m, x, tr, d)
           ON CONFLICT (position) DO NOTHING""",
        *[list(c) for c in columns],
    )


def _experiment_of(event: RecordedEvent, facts: Event | dict[str, Any]) -> int | None:
    experiment_id = _int(_field(facts, "experiment_id"))
    if experiment_id is None:
        experiment_id = experiment_of_stream(event.stream_id)
    return experiment_id


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


class AuditConsumer(PageConsumer):
    """Projects every event of the log into the audit trail (consumer ``tracker-audit``)."""

    name = NAME
    projection = True
    types = None

    async def handle_page(self, tx: Transaction, events: Sequence[RecordedEvent]) -> None:
        """Writes a page's audit rows in a few statements inside the consumer's transaction.

        Raises:
            EventsError: the database refused the rows (the page is retried).
        """
        try:
            await apply_page(tx.conn, events)
        except StatementError as exc:
            last = events[-1].position if events else 0
            raise EventsError(f"auditing the page up to position {last} failed: {exc}") from exc


async def rebuild(store: EventStore, *, batch: int = 5000) -> int:
    """Truncates the audit tables, resets their checkpoint and replays the log from position 0.

    One transaction holding the consumer's checkpoint lock: a live consumer waits, and readers
    never see a half-built trail.

    Returns:
        How many events were applied.
    """
    await migrate(store)
    applied = await rebuild_consumer(store, AuditConsumer(), TABLES, batch=batch)
    log.info("audit trail rebuilt", events=applied)
    return applied
