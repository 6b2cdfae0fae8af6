"""Readers of the tracker's projections (``tr_*`` tables, see ``docs/tracking.md``) and the
response models of the query API built from them.

The tables belong to the tracker and may lag the log by a moment; where the tracker has not
created them yet every reader answers as if they were empty. Timestamps leave as ISO 8601 text.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from events import lifecycle
from events.db import translate_errors
from events.errors import StatementError
from events.store import EventStore

MAX_LIMIT = 1000
MAX_OFFSET = 2**62


# --- models ---------------------------------------------------------------------------------


class Pagination(BaseModel):
    """Where a page sits in an ordered list."""

    offset: int
    limit: int
    total: int


class PageQuery(BaseModel):
    """``limit`` (1..1000) and ``offset`` of a paginated list."""

    limit: int = Field(100, ge=1, le=MAX_LIMIT)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


class ExperimentSummary(BaseModel):
    """One experiment in a list (``progress``: 1 once COMPLETED, else the mean of its trials'
    progress, or null; searcher-stopped trials never report 1, so the mean alone stops short;
    ``running_trials``: active trials that have started a run)."""

    id: int
    name: str | None
    owner: str
    state: str
    archived: bool
    searcher_name: str | None
    searcher_metric: str | None
    smaller_is_better: bool
    num_trials: int
    running_trials: int
    max_trials: int | None
    best_trial_id: int | None
    best_metric: float | None
    resource_pool: str | None
    submitted_at: str | None
    ended_at: str | None
    progress: float | None


class TrialSummary(BaseModel):
    """One trial as projected (``tr_trials``)."""

    trial_id: int
    experiment_id: int
    seq: int
    state: str
    hparams: dict[str, Any]
    trial_seed: int
    run_id: int
    restarts: int
    steps_completed: int
    latest_checkpoint: str | None
    best_metric: float | None
    latest_validation: dict[str, Any] | None
    requested_at: str | None
    started_at: str | None
    ended_at: str | None


class Allocation(BaseModel):
    """One run of a trial on its slots (``tr_allocations``)."""

    allocation_id: str
    trial_id: int
    experiment_id: int
    run_id: int
    placements: dict[str, list[str]]
    state: str
    outcome: str | None
    exit_code: int | None
    agent_id: str | None
    allocated_at: str | None
    started_at: str | None
    ended_at: str | None


class Checkpoint(BaseModel):
    """One checkpoint (``tr_checkpoints``); ``validation`` is the trial's validation at the
    same steps, ``searcher_metric`` its searcher metric."""

    uuid: str
    trial_id: int
    experiment_id: int
    run_id: int
    steps_completed: int
    resources: dict[str, Any]
    metadata: dict[str, Any]
    state: str
    reported_at: str | None
    deleted_at: str | None = None
    validation: dict[str, Any] | None
    searcher_metric: float | None


class Slot(BaseModel):
    """One slot of an agent as projected (``tr_slots``)."""

    agent_id: str
    slot_id: str
    device: str
    name: str
    enabled: bool
    draining: bool
    allocation_id: str | None


class Agent(BaseModel):
    """An agent with its slots; ``enabled`` is whether any of its slots is enabled."""

    agent_id: str
    resource_pool: str
    hostname: str
    state: str
    enabled: bool
    registered_at: str | None
    lost_at: str | None = None
    last_heartbeat: str | None
    slots: list[Slot]


# --- rows -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def as_dict(row: Any) -> dict[str, Any]:
    """A row as JSON-able data (timestamps as ISO 8601 text)."""
    return {key: _plain(value) for key, value in dict(row).items()}


async def fetch(store: EventStore, sql: str, *args: Any) -> list[Any]:
    """Runs a query on the projections; no rows when the tracker has not created its tables."""
    with translate_errors():
        try:
            return list(await store.pool.fetch(sql, *args))
        except StatementError as exc:
            if exc.undefined_table:
                return []
            raise


async def fetchrow(store: EventStore, sql: str, *args: Any) -> Any:
    """The first row of a projection query, or ``None``."""
    rows = await fetch(store, sql, *args)
    return rows[0] if rows else None


async def count(store: EventStore, sql: str, *args: Any) -> int:
    """The ``count(*)`` of a projection query (0 without the tracker's tables)."""
    row = await fetchrow(store, sql, *args)
    return int(row[0]) if row is not None else 0


class Where:
    """A conjunction of SQL conditions with numbered parameters."""

    def __init__(self) -> None:
        self.conditions: list[str] = []
        self.args: list[Any] = []

    def add(self, condition: str, *values: Any) -> None:
        """Adds ``condition``, where ``{}`` placeholders become the next parameter numbers."""
        numbers = []
        for value in values:
            self.args.append(value)
            numbers.append(f"${len(self.args)}")
        self.conditions.append(condition.format(*numbers))

    def sql(self) -> str:
        """``WHERE ...`` (or nothing)."""
        return "WHERE " + " AND ".join(self.conditions) if self.conditions else ""

    def next(self, count: int = 1) -> list[str]:
        """Placeholders for ``count`` parameters appended after the conditions' ones."""
        return [f"${len(self.args) + i + 1}" for i in range(count)]

    async def page(
        self,
        store: EventStore,
        columns: str,
        table: str,
        order: str,
        limit: int | None,
        offset: int,
    ) -> tuple[list[dict[str, Any]], int]:
        """The rows of ``table`` matching these conditions, in ``order``, one page of them, and
        how many match in all (``limit`` None: every row)."""
        total = await count(store, f"SELECT count(*) FROM {table} {self.sql()}", *self.args)
        lim, off = self.next(2)
        rows = await fetch(
            store,
            f"SELECT {columns} FROM {table} {self.sql()} ORDER BY {order} LIMIT {lim} OFFSET {off}",
            *self.args,
            limit,
            offset,
        )
        return [as_dict(r) for r in rows], total


# --- experiments ----------------------------------------------------------------------------

_EXPERIMENT_COLUMNS = """
    e.experiment_id AS id, e.name, e.owner, e.state, e.archived, e.searcher_name,
    e.searcher_metric, e.smaller_is_better, e.num_trials, e.max_trials, e.best_trial_id,
    e.best_metric, e.resource_pool, e.submitted_at, e.ended_at,
    (SELECT count(*) FROM tr_trials t WHERE t.experiment_id = e.experiment_id
       AND t.state = 'ACTIVE' AND t.started_at IS NOT NULL)::int AS running_trials,
    CASE WHEN e.state = 'COMPLETED' THEN 1.0 ELSE
      (SELECT avg(p.progress) FROM trial_progress p JOIN tr_trials t USING (trial_id)
       WHERE t.experiment_id = e.experiment_id) END AS progress"""


async def list_experiments(
    store: EventStore,
    *,
    states: Sequence[str] | None,
    owner: str | None,
    archived: bool | None,
    name: str | None,
    descending: bool,
    limit: int,
    offset: int,
) -> tuple[list[dict[str, Any]], int]:
    """A page of experiment summaries and the number matching the filters.

    Args:
        store: the event store (its pool).
        states: keep these states only (``None``: all).
        owner: keep this owner's only.
        archived: keep archived (``True``) or unarchived (``False``) ones; ``None``: both.
        name: keep names containing this text (case-insensitive).
        descending: newest first.
        limit: page size.
        offset: rows skipped.
    """
    where = Where()
    if states is not None:
        where.add("e.state = ANY({}::text[])", list(states))
    if owner is not None:
        where.add("e.owner = {}", owner)
    if archived is not None:
        where.add("e.archived = {}", archived)
    if name is not None:
        where.add("strpos(lower(coalesce(e.name, '')), lower({})) > 0", name)
    order = f"e.experiment_id {'DESC' if descending else 'ASC'}"
    return await where.page(store, _EXPERIMENT_COLUMNS, "tr_experiments e", order, limit, offset)


async def experiment_row(store: EventStore, experiment_id: int) -> dict[str, Any] | None:
    """One experiment's summary from the projection, or ``None``."""
    row = await fetchrow(
        store,
        f"SELECT {_EXPERIMENT_COLUMNS} FROM tr_experiments e WHERE e.experiment_id = $1",
        experiment_id,
    )
    return as_dict(row) if row is not None else None


# --- trials ---------------------------------------------------------------------------------

_TRIAL_COLUMNS = """
    trial_id, experiment_id, seq, state, hparams, trial_seed, run_id, restarts, steps_completed,
    latest_checkpoint, best_metric, latest_validation, requested_at, started_at, ended_at"""


async def list_trials(
    store: EventStore,
    experiment_id: int,
    *,
    states: Sequence[str] | None = None,
    best_first: bool = False,
    smaller_is_better: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """A page of an experiment's trials (by sequence, or best metric first) and their count."""
    where = Where()
    where.add("experiment_id = {}", experiment_id)
    if states is not None:
        where.add("state = ANY({}::text[])", list(states))
    direction = "ASC" if smaller_is_better else "DESC"
    order = f"best_metric {direction} NULLS LAST, seq" if best_first else "seq"
    return await where.page(store, _TRIAL_COLUMNS, "tr_trials", order, limit, offset)


async def trial_row(store: EventStore, trial_id: int) -> dict[str, Any] | None:
    """One trial's summary from the projection, or ``None``."""
    row = await fetchrow(
        store, f"SELECT {_TRIAL_COLUMNS} FROM tr_trials WHERE trial_id = $1", trial_id
    )
    return as_dict(row) if row is not None else None


async def allocations_of(store: EventStore, trial_id: int) -> list[dict[str, Any]]:
    """A trial's allocations by run."""
    rows = await fetch(
        store,
        """SELECT allocation_id, trial_id, experiment_id, run_id, placements, state, outcome,
                  exit_code, agent_id, allocated_at, started_at, ended_at
           FROM tr_allocations WHERE trial_id = $1 ORDER BY run_id""",
        trial_id,
    )
    return [as_dict(r) for r in rows]


async def trial_progress(store: EventStore, trial_id: int) -> float | None:
    """The trial's last reported progress (gateway table ``trial_progress``), or ``None``."""
    row = await fetchrow(store, "SELECT progress FROM trial_progress WHERE trial_id = $1", trial_id)
    return float(row["progress"]) if row is not None else None


# --- checkpoints ----------------------------------------------------------------------------

_CHECKPOINT_COLUMNS = """
    uuid, trial_id, experiment_id, run_id, steps_completed, resources, metadata, state,
    reported_at, deleted_at, validation, searcher_metric"""

CheckpointState = Literal["COMPLETED", "DELETED", "all"]


async def list_checkpoints(
    store: EventStore,
    *,
    experiment_id: int | None = None,
    trial_id: int | None = None,
    state: CheckpointState = "all",
    by_metric: bool = False,
    smaller_is_better: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """A page of an experiment's (or a trial's) checkpoints and their count.

    Ordered best searcher metric first (``by_metric``; unvalidated ones last) or most steps first.
    """
    where = Where()
    if experiment_id is not None:
        where.add("experiment_id = {}", experiment_id)
    if trial_id is not None:
        where.add("trial_id = {}", trial_id)
    if state != "all":
        where.add("state = {}", state)
    direction = "ASC" if smaller_is_better else "DESC"
    steps = "steps_completed DESC, reported_at DESC, uuid"
    order = f"searcher_metric {direction} NULLS LAST, {steps}" if by_metric else steps
    return await where.page(store, _CHECKPOINT_COLUMNS, "tr_checkpoints", order, limit, offset)


async def checkpoint_row(store: EventStore, uuid: str) -> dict[str, Any] | None:
    """One checkpoint from the projection, or ``None``."""
    row = await fetchrow(
        store, f"SELECT {_CHECKPOINT_COLUMNS} FROM tr_checkpoints WHERE uuid = $1", uuid
    )
    return as_dict(row) if row is not None else None


# --- agents ---------------------------------------------------------------------------------


async def list_slots(store: EventStore, agent_id: str | None = None) -> list[dict[str, Any]]:
    """Every slot (of one agent, or of all), by agent and slot id."""
    rows = await fetch(
        store,
        """SELECT agent_id, slot_id, device, name, enabled, draining, allocation_id
           FROM tr_slots WHERE $1::text IS NULL OR agent_id = $1
           ORDER BY agent_id, slot_id""",
        agent_id,
    )
    return [as_dict(r) for r in rows]


async def list_agents(store: EventStore, agent_id: str | None = None) -> list[dict[str, Any]]:
    """Every agent (or one) with its slots and last heartbeat, by agent id."""
    rows = await fetch(
        store,
        """SELECT a.agent_id, a.resource_pool, a.hostname, a.state, a.registered_at, a.lost_at,
                  h.beat_at AS last_heartbeat
           FROM tr_agents a LEFT JOIN agent_heartbeats h USING (agent_id)
           WHERE $1::text IS NULL OR a.agent_id = $1
           ORDER BY a.agent_id""",
        agent_id,
    )
    slots: dict[str, list[dict[str, Any]]] = {}
    for slot in await list_slots(store, agent_id):
        slots.setdefault(slot["agent_id"], []).append(slot)
    agents = []
    for row in rows:
        agent = as_dict(row)
        agent["slots"] = slots.get(agent["agent_id"], [])
        agent["enabled"] = any(s["enabled"] for s in agent["slots"])
        agents.append(agent)
    return agents


# --- query helpers --------------------------------------------------------------------------


def check_states(value: str | None) -> str | None:
    """Validates a comma-separated list of lifecycle states (a pydantic field validator body).

    Raises:
        ValueError: an empty list or an unknown state.
    """
    if value is None:
        return None
    states = [s.strip().upper() for s in value.split(",") if s.strip()]
    if not states:
        raise ValueError("must name at least one state")
    unknown = sorted(set(states) - lifecycle.STATES)
    if unknown:
        raise ValueError(f"unknown state(s) {unknown}; known: {sorted(lifecycle.STATES)}")
    return ",".join(states)


def states_of(value: str | None) -> list[str] | None:
    """The states of a validated comma list (``None``: no filter)."""
    return value.split(",") if value else None


def pagination(query: PageQuery, total: int) -> dict[str, int]:
    """The ``pagination`` object of a list response."""
    return {"offset": query.offset, "limit": query.limit, "total": total}
