"""Usage billing: slot-milliseconds per user, experiment, resource pool and slot type.

Consumer ``tracker-usage`` folds allocation facts into ``tr_usage``: one row per allocation and
(resource pool, slot type) its slots are of, holding how many slots, whose experiment's trial or
whose task they ran, and the allocation's interval in integer milliseconds since the epoch:

- it starts at ``SlotsAllocated`` (the slots are held for the trial from then on), or at
  ``TaskAllocated`` for a task (a command's slots are held from its placement);
- it ends at the first of ``TrialExited`` / ``SlotsReleased`` for that allocation, or at the
  task's ``TaskExited``. An agent that stops heartbeating (``AgentLost``) ends nothing by
  itself: its runs count until the scheduler's verdict on them (its ``TrialExited{lost}`` or
  ``TaskExited{lost}``), as that is when the slots return. A zero-slot task bills nothing.

Every instant is an event's ``recorded_at`` truncated to the millisecond, never the clock, and
every rule depends only on the log's order, so :func:`rebuild` gives the same rows as the live
consumer. The owner, pool and slot type are taken as the log said at allocation time (the
consumer keeps its own small lookup tables for that), so later renames or deletions never change
what was billed. An experiment's deletion keeps its usage.

:func:`usage_report` aggregates the rows over a window, clipping each interval to it; an
allocation still open counts up to ``now``. A task is billed to the workspace its
``TaskRequested`` named (kept in ``tr_usage_tasks``); an experiment to its project's workspace
now, which the caller maps (the tracker does not read the teams stream).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

import structlog

from events.domain.authorization import DEFAULT_WORKSPACE_ID
from events.domain.types import (
    AgentRegistered,
    ExperimentSubmitted,
    SlotsAllocated,
    SlotsReleased,
    TaskAllocated,
    TaskExited,
    TaskRequested,
    TrialExited,
    TrialRequested,
)
from events.log.consumer import Consumer
from events.log.db import Connection
from events.log.envelope import Event, RecordedEvent
from events.log.errors import EventsError, StatementError
from events.log.store import EventStore, Transaction
from services.tracker.rebuild import rebuild_consumer

log = structlog.get_logger("tracker.usage")

NAME = "tracker-usage"
TYPES = frozenset(
    {
        "ExperimentSubmitted",
        "TrialRequested",
        "AgentRegistered",
        "SlotsAllocated",
        "TrialExited",
        "SlotsReleased",
        "TaskRequested",
        "TaskAllocated",
        "TaskExited",
    }
)
"""The event types the usage projection reads."""

TABLES: tuple[str, ...] = (
    "tr_usage",
    "tr_usage_owners",
    "tr_usage_trials",
    "tr_usage_slots",
    "tr_usage_tasks",
)
"""The usage projection's tables (kept apart from ``schema.TABLES``: deleting an experiment
removes its projections, never its usage)."""

UNKNOWN = "unknown"
"""Pool and slot type of slots the log never registered."""

MS_PER_DAY = 86_400_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

MIGRATION: tuple[str, str] = (
    "0003_usage",
    """
    CREATE TABLE tr_usage (
        allocation_id  text NOT NULL,
        resource_pool  text NOT NULL,
        slot_type      text NOT NULL,
        trial_id       bigint NOT NULL,
        experiment_id  bigint NOT NULL,
        owner          text NOT NULL,
        slots          integer NOT NULL,
        started_ms     bigint NOT NULL,
        ended_ms       bigint,
        PRIMARY KEY (allocation_id, resource_pool, slot_type)
    );
    CREATE INDEX tr_usage_started ON tr_usage (started_ms);
    CREATE INDEX tr_usage_owner ON tr_usage (owner, started_ms);

    CREATE TABLE tr_usage_owners (
        experiment_id  bigint PRIMARY KEY,
        owner          text NOT NULL
    );
    CREATE TABLE tr_usage_trials (
        trial_id       bigint PRIMARY KEY,
        experiment_id  bigint NOT NULL
    );
    CREATE TABLE tr_usage_slots (
        agent_id       text NOT NULL,
        slot_id        text NOT NULL,
        resource_pool  text NOT NULL,
        slot_type      text NOT NULL,
        PRIMARY KEY (agent_id, slot_id)
    );
    """,
)
"""The tracker migration that creates the usage tables."""

TASKS_MIGRATION: tuple[str, str] = (
    "0006_usage_tasks",
    """
    ALTER TABLE tr_usage
        ALTER COLUMN trial_id DROP NOT NULL,
        ALTER COLUMN experiment_id DROP NOT NULL,
        ADD COLUMN task_id text;
    CREATE TABLE tr_usage_tasks (
        task_id        text PRIMARY KEY,
        owner          text NOT NULL
    );
    """,
)
"""The tracker migration that bills tasks: a ``tr_usage`` row is a trial's (``trial_id``,
``experiment_id``) or a task's (``task_id``); ``tr_usage_tasks`` keeps each task's owner."""

TASK_WORKSPACES_MIGRATION: tuple[str, str] = (
    "0008_usage_task_workspaces",
    """
    ALTER TABLE tr_usage_tasks ADD COLUMN workspace_id integer NOT NULL DEFAULT 1;
    """,
)
"""The tracker migration that bills tasks to their workspace: ``tr_usage_tasks.workspace_id`` is
the one the task's ``TaskRequested`` named (1, the default, for tasks requested before
workspaces, and for rows written before this migration until a rebuild)."""


def epoch_ms(at: datetime) -> int:
    """``at`` as whole milliseconds since the epoch (truncated toward the past), exactly."""
    return (at - EPOCH) // _MS


class UsageConsumer(Consumer):
    """Folds allocation facts into ``tr_usage`` (consumer ``tracker-usage``)."""

    name = NAME
    projection = True
    types = TYPES

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        """Applies one event to the usage tables inside the consumer's transaction.

        Raises:
            EventsError: the database refused a statement (the page is retried).
        """
        try:
            payload = event.decode()
        except Exception as exc:  # a payload the current models reject: skip, never wedge
            log.warning("event not billed", position=event.position, error=str(exc))
            return
        try:
            await apply(tx.conn, payload, epoch_ms(event.recorded_at))
        except StatementError as exc:
            raise EventsError(
                f"billing {event.type} at position {event.position} failed: {exc}"
            ) from exc


async def apply(conn: Connection, event: Event, ms: int) -> None:
    """Applies one decoded event, recorded at ``ms`` milliseconds since the epoch."""
    if isinstance(event, ExperimentSubmitted):
        await conn.execute(
            """INSERT INTO tr_usage_owners (experiment_id, owner) VALUES ($1, $2)
               ON CONFLICT (experiment_id) DO NOTHING""",
            event.experiment_id,
            event.owner,
        )
    elif isinstance(event, TrialRequested):
        await conn.execute(
            """INSERT INTO tr_usage_trials (trial_id, experiment_id) VALUES ($1, $2)
               ON CONFLICT (trial_id) DO NOTHING""",
            event.trial_id,
            event.experiment_id,
        )
    elif isinstance(event, AgentRegistered):
        await _agent_registered(conn, event)
    elif isinstance(event, SlotsAllocated):
        await _slots_allocated(conn, event, ms)
    elif isinstance(event, TaskRequested):
        await conn.execute(
            """INSERT INTO tr_usage_tasks (task_id, owner, workspace_id) VALUES ($1, $2, $3)
               ON CONFLICT (task_id) DO NOTHING""",
            event.task_id,
            event.owner,
            event.workspace_id,
        )
    elif isinstance(event, TaskAllocated):
        await _task_allocated(conn, event, ms)
    elif isinstance(event, TrialExited | SlotsReleased | TaskExited):
        # The first exit fact ends the interval; an instant before the start (clock skew
        # between transactions) bills zero, never a negative span.
        await conn.execute(
            """UPDATE tr_usage SET ended_ms = greatest(started_ms, $2)
               WHERE allocation_id = $1 AND ended_ms IS NULL""",
            event.allocation_id,
            ms,
        )


async def _agent_registered(conn: Connection, e: AgentRegistered) -> None:
    """The agent's slot set is replaced by the registered one (pool and device per slot)."""
    await conn.execute("DELETE FROM tr_usage_slots WHERE agent_id = $1", e.agent_id)
    if e.slots:
        await conn.execute(
            """INSERT INTO tr_usage_slots (agent_id, slot_id, resource_pool, slot_type)
               SELECT $1, u.slot_id, $2, u.slot_type
               FROM unnest($3::text[], $4::text[]) AS u(slot_id, slot_type)
               ON CONFLICT (agent_id, slot_id) DO NOTHING""",
            e.agent_id,
            e.resource_pool,
            [s.slot_id for s in e.slots],
            [s.device for s in e.slots],
        )


async def _slots_allocated(conn: Connection, e: SlotsAllocated, ms: int) -> None:
    owner_row = await conn.fetchrow(
        """SELECT t.experiment_id, coalesce(o.owner, '') AS owner
           FROM tr_usage_trials t LEFT JOIN tr_usage_owners o USING (experiment_id)
           WHERE t.trial_id = $1""",
        e.trial_id,
    )
    if owner_row is None:
        return  # a trial the log never requested: nothing to bill it to
    await _bill(
        conn,
        e.allocation_id,
        e.placements,
        ms,
        owner=str(owner_row["owner"]),
        trial_id=e.trial_id,
        experiment_id=int(owner_row["experiment_id"]),
    )


async def _task_allocated(conn: Connection, e: TaskAllocated, ms: int) -> None:
    owner = await conn.fetchval("SELECT owner FROM tr_usage_tasks WHERE task_id = $1", e.task_id)
    if owner is None:
        return  # a task the log never requested: nothing to bill it to
    await _bill(conn, e.allocation_id, e.placements, ms, owner=str(owner), task_id=e.task_id)


async def _bill(
    conn: Connection,
    allocation_id: str,
    placements: Mapping[str, list[str]],
    ms: int,
    *,
    owner: str,
    trial_id: int | None = None,
    experiment_id: int | None = None,
    task_id: str | None = None,
) -> None:
    """Opens the allocation's rows: its slots counted per (pool, slot type) they are of."""
    pairs = [(agent, slot) for agent, slots in sorted(placements.items()) for slot in slots]
    known = {
        (str(r["agent_id"]), str(r["slot_id"])): (str(r["resource_pool"]), str(r["slot_type"]))
        for r in await conn.fetch(
            """SELECT agent_id, slot_id, resource_pool, slot_type FROM tr_usage_slots
               WHERE agent_id = ANY($1::text[])""",
            sorted(placements),
        )
    }
    pools = {agent: pool for (agent, _), (pool, _) in sorted(known.items())}
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for agent, slot in pairs:
        kind = known.get((agent, slot), (pools.get(agent, UNKNOWN), UNKNOWN))
        counts[kind] += 1
    if not counts:
        return
    keys = sorted(counts)
    await conn.execute(
        """INSERT INTO tr_usage (allocation_id, resource_pool, slot_type, trial_id, experiment_id,
                                 task_id, owner, slots, started_ms)
           SELECT $1, u.pool, u.kind, $2, $3, $4, $5, u.slots, $6
           FROM unnest($7::text[], $8::text[], $9::int[]) AS u(pool, kind, slots)
           ON CONFLICT (allocation_id, resource_pool, slot_type) DO NOTHING""",
        allocation_id,
        trial_id,
        experiment_id,
        task_id,
        owner,
        ms,
        [pool for pool, _ in keys],
        [kind for _, kind in keys],
        [counts[k] for k in keys],
    )


async def rebuild(store: EventStore, *, batch: int = 5000) -> int:
    """Truncates the usage tables, resets their checkpoint and replays the log to its head,
    in one transaction holding the consumer's checkpoint lock; returns the events applied."""
    applied = await rebuild_consumer(store, UsageConsumer(), TABLES, batch=batch)
    log.info("usage rebuilt", events=applied)
    return applied


# ------------------------------------------------------------------------------------ reports

By = Literal["user", "pool", "experiment", "project", "workspace", "day"]
BY_CHOICES: tuple[str, ...] = ("user", "pool", "experiment", "project", "workspace", "day")


@dataclass(frozen=True)
class Span:
    """One ``tr_usage`` row: ``slots`` slots of one type held over ``[started_ms, ended_ms)``
    (``experiment_id`` ``None``: a task's)."""

    owner: str
    experiment_id: int | None
    resource_pool: str
    slot_type: str
    slots: int
    started_ms: int
    ended_ms: int | None
    project_id: int = 1
    """The project its experiment is in now (a task's: the default project)."""
    workspace_id: int | None = None
    """A task's workspace (``None``: an experiment's, which is its project's)."""


def _key(span: Span, by: str, workspaces: Mapping[int, int]) -> str | int | None:
    if by == "user":
        return span.owner
    if by == "pool":
        return span.resource_pool
    if by == "project":
        return span.project_id
    if by == "workspace":
        if span.workspace_id is not None:
            return span.workspace_id
        return workspaces.get(span.project_id, DEFAULT_WORKSPACE_ID)
    return span.experiment_id


def day_of(ms: int) -> str:
    """The UTC date (``YYYY-MM-DD``) of an instant in epoch milliseconds."""
    return (date(1970, 1, 1) + timedelta(days=ms // MS_PER_DAY)).isoformat()


def aggregate(
    spans: Iterable[Span],
    start_ms: int,
    end_ms: int,
    by: str,
    now_ms: int,
    *,
    workspaces: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Slot-milliseconds of ``spans`` inside ``[start_ms, end_ms)``, grouped by ``by`` and slot
    type (``day``: split at UTC midnights); an open span counts up to ``now_ms``.

    Args:
        spans: The billed spans (see :func:`spans`).
        start_ms: The window's first instant, in epoch milliseconds.
        end_ms: The instant after the window's last one.
        by: ``user``, ``pool``, ``experiment``, ``project``, ``workspace`` or ``day``.
        now_ms: Where open spans end.
        workspaces: ``{project_id: workspace_id}`` as the teams are now; required by
            ``workspace``. A project it lacks (a deleted one) counts as the default workspace's.

    Returns:
        Rows ``{<by>: key, "slot_type", "slot_ms", "slot_seconds"}`` ordered by key and type;
        ``slot_seconds`` is ``slot_ms / 1000`` (exact to the millisecond). By experiment, the
        tasks' usage is the row whose key is ``None`` (they are no experiment's); by project,
        tasks count as the default project's; by workspace, a task counts for its own workspace
        and an experiment for its project's.

    Raises:
        ValueError: ``by`` is ``workspace`` and no ``workspaces`` mapping was given.
    """
    if by == "workspace" and workspaces is None:
        raise ValueError("usage by workspace needs the projects' workspaces (workspaces=)")
    places: Mapping[int, int] = workspaces or {}
    totals: dict[tuple[str | int | None, str], int] = defaultdict(int)
    for span in spans:
        lo = max(span.started_ms, start_ms)
        hi = min(now_ms if span.ended_ms is None else span.ended_ms, end_ms)
        if hi <= lo or span.slots <= 0:
            continue
        if by != "day":
            totals[(_key(span, by, places), span.slot_type)] += span.slots * (hi - lo)
            continue
        cut = lo
        while cut < hi:
            midnight = (cut // MS_PER_DAY + 1) * MS_PER_DAY
            upto = min(hi, midnight)
            totals[(day_of(cut), span.slot_type)] += span.slots * (upto - cut)
            cut = upto
    return [
        {by: key, "slot_type": kind, "slot_ms": ms, "slot_seconds": ms / 1000}
        for (key, kind), ms in sorted(totals.items(), key=lambda item: (str(item[0][0]), item[0]))
    ]


async def spans(
    conn: Connection, start_ms: int, end_ms: int, *, owner: str | None = None
) -> list[Span]:
    """The ``tr_usage`` rows that may overlap ``[start_ms, end_ms)`` (``owner``: only theirs),
    each with its experiment's project now or its task's workspace."""
    rows = await conn.fetch(
        """SELECT u.owner, u.experiment_id, u.resource_pool, u.slot_type, u.slots,
                  u.started_ms, u.ended_ms, coalesce(e.project_id, 1) AS project_id,
                  t.workspace_id
           FROM tr_usage u LEFT JOIN tr_experiments e ON e.experiment_id = u.experiment_id
                LEFT JOIN tr_usage_tasks t ON t.task_id = u.task_id
           WHERE u.started_ms < $2 AND (u.ended_ms IS NULL OR u.ended_ms > $1)
             AND ($3::text IS NULL OR u.owner = $3)
           ORDER BY u.allocation_id, u.resource_pool, u.slot_type""",
        start_ms,
        end_ms,
        owner,
    )
    return [
        Span(
            owner=str(r["owner"]),
            experiment_id=None if r["experiment_id"] is None else int(r["experiment_id"]),
            resource_pool=str(r["resource_pool"]),
            slot_type=str(r["slot_type"]),
            slots=int(r["slots"]),
            started_ms=int(r["started_ms"]),
            ended_ms=None if r["ended_ms"] is None else int(r["ended_ms"]),
            project_id=int(r["project_id"]),
            workspace_id=None if r["workspace_id"] is None else int(r["workspace_id"]),
        )
        for r in rows
    ]


async def usage_report(
    conn: Connection,
    start_ms: int,
    end_ms: int,
    by: str,
    *,
    owner: str | None = None,
    now_ms: int | None = None,
    workspaces: Mapping[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Usage in ``[start_ms, end_ms)`` grouped by ``by`` (see :func:`aggregate`; by
    ``workspace``, ``workspaces`` maps each project to its workspace now).

    Raises:
        ValueError: ``by`` is ``workspace`` and no ``workspaces`` mapping was given.
    """
    now = epoch_ms(datetime.now(UTC)) if now_ms is None else now_ms
    found = await spans(conn, start_ms, end_ms, owner=owner)
    return aggregate(found, start_ms, end_ms, by, now, workspaces=workspaces)


CSV_COLUMNS: Mapping[str, Sequence[str]] = {
    by: (by, "slot_type", "slot_seconds", "slot_ms") for by in BY_CHOICES
}
"""The CSV header of each grouping."""


def slot_seconds_text(ms: int) -> str:
    """Slot-milliseconds as seconds with exactly three decimals (``12345`` -> ``12.345``)."""
    sign = "-" if ms < 0 else ""
    whole, frac = divmod(abs(ms), 1000)
    return f"{sign}{whole}.{frac:03d}"
