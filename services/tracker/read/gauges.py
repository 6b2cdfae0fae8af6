"""The tracker's reads behind the cluster's Prometheus gauges: counts grouped by resource pool,
state and agent, never by user, experiment or trial (see ``docs/operations.md``).

Each is one aggregate query over the projections, cheap enough for every scrape, and answers as
if the tables were empty while the tracker has not created them. A pool named by an experiment's
config but served by no agent is reported under :data:`OTHER_POOL`: the label's values are
bounded by the pools the operator's agents join, never by what a user types.
"""

from __future__ import annotations

from typing import TypedDict, cast

from events.log.db import Connection
from services.tracker.read.sql import fetch_rows

DEFAULT_POOL = "default"
"""The pool of an experiment whose config names none (as the cluster's queue shows it)."""
OTHER_POOL = "other"
"""The label of waiting trials whose pool no agent has joined."""


class QueueGauge(TypedDict):
    """The waiting trials of one pool: how many, and how long the oldest has waited."""

    pool: str
    waiting: int
    oldest_wait_seconds: float


class SlotGauge(TypedDict):
    """The slots of one pool: holding an allocation, free to place on, or neither (disabled,
    draining, or on a lost agent)."""

    pool: str
    used: int
    free: int
    unavailable: int


class StateCount(TypedDict):
    """How many rows are in one state (of one pool, for agents)."""

    pool: str
    state: str
    count: int


class AgentState(TypedDict):
    """An agent as the projection holds it (its id is the operator's name for a machine)."""

    agent_id: str
    pool: str
    state: str


class WebhookBacklog(TypedDict):
    """The deliveries not yet answered: how many, the lowest log position among them, and how
    long the oldest has been queued (``None``: nothing pending)."""

    pending: int
    oldest_position: int | None
    oldest_queued_seconds: float | None


async def agents(conn: Connection) -> list[AgentState]:
    """Every agent with its pool and state (``active`` or ``lost``), by agent id."""
    rows = await fetch_rows(
        conn,
        """SELECT agent_id, coalesce(nullif(resource_pool, ''), 'default') AS pool, state
           FROM tr_agents ORDER BY agent_id""",
    )
    return cast(list[AgentState], rows)


async def queue_by_pool(conn: Connection) -> list[QueueGauge]:
    """Per pool, the active trials of active experiments holding no allocation and the age of
    the oldest request among them (database clock)."""
    rows = await fetch_rows(
        conn,
        """WITH waiting AS (
             SELECT coalesce(nullif(e.resource_pool, ''), 'default') AS pool, t.requested_at
             FROM tr_trials t JOIN tr_experiments e USING (experiment_id)
             WHERE e.state = 'ACTIVE' AND t.state = 'ACTIVE'
               AND NOT EXISTS (SELECT 1 FROM tr_allocations a
                               WHERE a.trial_id = t.trial_id AND a.state <> 'TERMINATED'))
           SELECT CASE WHEN w.pool = 'default'
                         OR w.pool IN (SELECT resource_pool FROM tr_agents) THEN w.pool
                       ELSE 'other' END AS pool,
                  count(*) AS waiting,
                  coalesce(extract(epoch FROM now() - min(w.requested_at)), 0)::float8
                      AS oldest_wait_seconds
           FROM waiting w GROUP BY 1 ORDER BY 1""",
    )
    return cast(list[QueueGauge], rows)


async def slots_by_pool(conn: Connection) -> list[SlotGauge]:
    """Per pool of the agents, the slots used, free and unavailable."""
    rows = await fetch_rows(
        conn,
        """SELECT coalesce(nullif(a.resource_pool, ''), 'default') AS pool,
                  count(*) FILTER (WHERE s.allocation_id IS NOT NULL) AS used,
                  count(*) FILTER (WHERE s.allocation_id IS NULL AND s.enabled
                                     AND NOT s.draining AND a.state = 'active') AS free,
                  count(*) FILTER (WHERE s.allocation_id IS NULL AND NOT (s.enabled
                                     AND NOT s.draining AND a.state = 'active')) AS unavailable
           FROM tr_slots s JOIN tr_agents a USING (agent_id)
           GROUP BY 1 ORDER BY 1""",
    )
    return cast(list[SlotGauge], rows)


async def allocations_by_state(conn: Connection) -> list[StateCount]:
    """How many allocations are in each state (``pool`` is '': allocations are counted
    cluster-wide)."""
    rows = await fetch_rows(
        conn,
        """SELECT '' AS pool, state, count(*) AS count FROM tr_allocations
           GROUP BY state ORDER BY state""",
    )
    return cast(list[StateCount], rows)


async def webhook_backlog(conn: Connection) -> WebhookBacklog:
    """The pending webhook deliveries, all webhooks together."""
    rows = await fetch_rows(
        conn,
        """SELECT count(*) AS pending, min(position) AS oldest_position,
                  extract(epoch FROM now() - min(queued_at))::float8 AS oldest_queued_seconds
           FROM webhook_deliveries WHERE state = 'pending'""",
    )
    if not rows:
        return {"pending": 0, "oldest_position": None, "oldest_queued_seconds": None}
    return cast(WebhookBacklog, rows[0])
