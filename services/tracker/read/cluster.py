"""The tracker's reads of agents, slots and the cluster's queue and allocations."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict, cast

from events.log.db import Connection
from services.tracker.read.sql import fetch_count, fetch_rows


class SlotRow(TypedDict):
    """One slot of an agent (``tr_slots``)."""

    agent_id: str
    slot_id: str
    device: str
    name: str
    enabled: bool
    draining: bool
    allocation_id: str | None


class AgentRow(TypedDict):
    """One agent of ``tr_agents``."""

    agent_id: str
    resource_pool: str
    hostname: str
    state: str
    registered_at: datetime | None
    lost_at: datetime | None


class WaitingTrialRow(TypedDict):
    """An active trial of an active experiment holding no allocation, with what the queue
    shows of its experiment (``priority``/``slots`` as the config gave them, unparsed)."""

    trial_id: int
    experiment_id: int
    name: str | None
    owner: str
    resource_pool: str | None
    priority: str | None
    slots: str | None
    requested_at: datetime | None


class LiveAllocationRow(TypedDict):
    """An allocation not yet terminated and the owner of its experiment."""

    allocation_id: str
    trial_id: int
    experiment_id: int
    state: str
    agent_id: str | None
    owner: str


class AllocationSpanRow(TypedDict):
    """When an allocation held its slots (``ended_at`` None: still holds them)."""

    since: datetime
    ended_at: datetime | None
    placements: dict[str, list[str]] | Any


async def list_slots(conn: Connection, agent_id: str | None = None) -> list[SlotRow]:
    """Every slot (of one agent, or of all), by agent and slot id."""
    rows = await fetch_rows(
        conn,
        """SELECT agent_id, slot_id, device, name, enabled, draining, allocation_id
           FROM tr_slots WHERE $1::text IS NULL OR agent_id = $1
           ORDER BY agent_id, slot_id""",
        agent_id,
    )
    return cast(list[SlotRow], rows)


async def list_agents(conn: Connection, agent_id: str | None = None) -> list[AgentRow]:
    """Every agent (or one), by agent id."""
    rows = await fetch_rows(
        conn,
        """SELECT agent_id, resource_pool, hostname, state, registered_at, lost_at
           FROM tr_agents WHERE $1::text IS NULL OR agent_id = $1
           ORDER BY agent_id""",
        agent_id,
    )
    return cast(list[AgentRow], rows)


async def enabled_slots(conn: Connection) -> int:
    """How many slots are enabled."""
    return await fetch_count(conn, "SELECT count(*) FROM tr_slots WHERE enabled")


async def waiting_trials(conn: Connection, limit: int = 10_000) -> list[WaitingTrialRow]:
    """Active trials of active experiments that hold no allocation, by request time."""
    rows = await fetch_rows(
        conn,
        """SELECT t.trial_id, t.experiment_id, e.name, e.owner, e.resource_pool,
                  e.config -> 'resources' ->> 'priority' AS priority,
                  e.config -> 'resources' ->> 'slots_per_trial' AS slots, t.requested_at
           FROM tr_trials t JOIN tr_experiments e USING (experiment_id)
           WHERE e.state = 'ACTIVE' AND t.state = 'ACTIVE'
             AND NOT EXISTS (SELECT 1 FROM tr_allocations a
                             WHERE a.trial_id = t.trial_id AND a.state <> 'TERMINATED')
           ORDER BY t.requested_at, t.trial_id
           LIMIT $1""",
        limit,
    )
    return cast(list[WaitingTrialRow], rows)


async def live_allocations(conn: Connection, limit: int = 10_000) -> list[LiveAllocationRow]:
    """The allocations not yet terminated, by allocation id, with their experiment's owner."""
    rows = await fetch_rows(
        conn,
        """SELECT a.allocation_id, a.trial_id, a.experiment_id, a.state, a.agent_id, e.owner
           FROM tr_allocations a JOIN tr_experiments e USING (experiment_id)
           WHERE a.state <> 'TERMINATED' ORDER BY a.allocation_id LIMIT $1""",
        limit,
    )
    return cast(list[LiveAllocationRow], rows)


async def allocation_spans(conn: Connection, since: datetime) -> list[AllocationSpanRow]:
    """When each allocation that held slots at or after ``since`` held them."""
    rows = await fetch_rows(
        conn,
        """SELECT coalesce(started_at, allocated_at) AS since, ended_at, placements
           FROM tr_allocations WHERE ended_at IS NULL OR ended_at > $1""",
        since,
    )
    return cast(list[AllocationSpanRow], rows)
