"""The tracker's projection of agent facts: ``tr_agents`` and ``tr_slots`` rows. Part of
:mod:`services.tracker.projections`, which applies these in log order."""

from __future__ import annotations

from datetime import datetime

from events.domain.types import AgentLost, AgentRegistered, SlotsDisabled, SlotsEnabled
from events.log.db import Connection


async def agent_registered(conn: Connection, e: AgentRegistered, at: datetime) -> None:
    """Upserts the agent (active again) and replaces its slot set."""
    await conn.execute(
        """INSERT INTO tr_agents (agent_id, resource_pool, hostname, state, registered_at)
           VALUES ($1, $2, $3, 'active', $4)
           ON CONFLICT (agent_id) DO UPDATE
           SET resource_pool = excluded.resource_pool, hostname = excluded.hostname,
               state = 'active', registered_at = excluded.registered_at, lost_at = NULL""",
        e.agent_id,
        e.resource_pool,
        e.hostname,
        at,
    )
    slots = {slot.slot_id: slot for slot in e.slots}
    # The agent's slot set is replaced; slots it still has keep their enabled/draining flags
    # (a disable outlives a re-registration, as in the scheduler) and their allocation.
    await conn.execute(
        "DELETE FROM tr_slots WHERE agent_id = $1 AND NOT (slot_id = ANY($2::text[]))",
        e.agent_id,
        list(slots),
    )
    if slots:
        await conn.execute(
            """INSERT INTO tr_slots (agent_id, slot_id, device, name, enabled, draining)
               SELECT $1, u.slot_id, u.device, u.name, true, false
               FROM unnest($2::text[], $3::text[], $4::text[]) AS u(slot_id, device, name)
               ON CONFLICT (agent_id, slot_id) DO UPDATE
               SET device = excluded.device, name = excluded.name""",
            e.agent_id,
            list(slots),
            [s.device for s in slots.values()],
            [s.name for s in slots.values()],
        )


async def agent_lost(conn: Connection, e: AgentLost, at: datetime) -> None:
    """Marks the agent lost."""
    await conn.execute(
        "UPDATE tr_agents SET state = 'lost', lost_at = $2 WHERE agent_id = $1",
        e.agent_id,
        at,
    )


async def slots_toggled(conn: Connection, e: SlotsDisabled | SlotsEnabled) -> None:
    """Enables or disables (maybe draining) some of an agent's slots, or all of them."""
    enabled = isinstance(e, SlotsEnabled)
    drain = isinstance(e, SlotsDisabled) and e.drain
    await conn.execute(
        """UPDATE tr_slots SET enabled = $3, draining = $4
           WHERE agent_id = $1 AND (cardinality($2::text[]) = 0 OR slot_id = ANY($2::text[]))""",
        e.agent_id,
        list(e.slot_ids),
        enabled,
        drain,
    )
