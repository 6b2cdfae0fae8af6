"""The tracker's projection of trial and allocation facts: ``tr_trials`` and ``tr_allocations``
rows, and which slots an allocation holds. Part of :mod:`services.tracker.projections`, which
applies these in log order."""

from __future__ import annotations

from datetime import datetime

from events.domain.lifecycle import TERMINAL, next_trial_state
from events.domain.types import (
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialRestarted,
    TrialStarted,
    TrialStateChanged,
)
from events.log.db import Connection
from services.tracker import series


async def experiment_of_trial(conn: Connection, trial_id: int) -> int | None:
    """The experiment of a projected trial (``None``: its ``TrialRequested`` was not projected,
    e.g. its experiment was deleted)."""
    value = await conn.fetchval("SELECT experiment_id FROM tr_trials WHERE trial_id = $1", trial_id)
    return None if value is None else int(value)


async def trial_requested(conn: Connection, e: TrialRequested, at: datetime) -> None:
    """Inserts the trial's row and counts it in its experiment's ``num_trials`` (once)."""
    await conn.execute(
        """WITH ins AS (
               INSERT INTO tr_trials (trial_id, experiment_id, seq, state, hparams, trial_seed,
                                      requested_at)
               VALUES ($1, $2, $3, 'ACTIVE', $4, $5, $6)
               ON CONFLICT (trial_id) DO NOTHING
               RETURNING experiment_id)
           UPDATE tr_experiments x SET num_trials = x.num_trials + 1
           FROM ins WHERE x.experiment_id = ins.experiment_id""",
        e.trial_id,
        e.experiment_id,
        e.seq,
        e.hparams,
        e.trial_seed,
        at,
    )


async def trial_state(conn: Connection, e: TrialStateChanged, at: datetime) -> None:
    """Moves the trial's state (as the state machine allows) and rolls up its chart series."""
    current = await conn.fetchval("SELECT state FROM tr_trials WHERE trial_id = $1", e.trial_id)
    if current is None or current == e.state or next_trial_state(str(current), e.state) is None:
        return  # no change, or refused by the state machine: never applied
    await conn.execute(
        "UPDATE tr_trials SET state = $2, ended_at = $3 WHERE trial_id = $1",
        e.trial_id,
        e.state,
        at if e.state in TERMINAL else None,
    )
    await series.on_trial_state(conn, e.trial_id, e.state)


async def trial_restarted(conn: Connection, e: TrialRestarted) -> None:
    """Sets the trial's restart count."""
    await conn.execute(
        "UPDATE tr_trials SET restarts = $2 WHERE trial_id = $1",
        e.trial_id,
        e.restarts,
    )


async def slots_allocated(conn: Connection, e: SlotsAllocated, at: datetime) -> None:
    """Inserts the allocation, moves its trial's run and marks the slots it holds."""
    experiment_id = await experiment_of_trial(conn, e.trial_id)
    if experiment_id is None:
        return
    await conn.execute(
        """INSERT INTO tr_allocations (allocation_id, trial_id, experiment_id, run_id, placements,
                                      state, allocated_at)
           VALUES ($1, $2, $3, $4, $5, 'ASSIGNED', $6)
           ON CONFLICT (allocation_id) DO NOTHING""",
        e.allocation_id,
        e.trial_id,
        experiment_id,
        e.run_id,
        {agent: list(slots) for agent, slots in e.placements.items()},
        at,
    )
    await conn.execute(
        "UPDATE tr_trials SET run_id = greatest(run_id, $2) WHERE trial_id = $1",
        e.trial_id,
        e.run_id,
    )
    pairs = [(agent, slot) for agent, slots in e.placements.items() for slot in slots]
    if pairs:
        await conn.execute(
            """UPDATE tr_slots s SET allocation_id = $1
               FROM unnest($2::text[], $3::text[]) AS u(agent_id, slot_id)
               WHERE s.agent_id = u.agent_id AND s.slot_id = u.slot_id""",
            e.allocation_id,
            [a for a, _ in pairs],
            [s for _, s in pairs],
        )


async def trial_started(conn: Connection, e: TrialStarted, at: datetime) -> None:
    """The allocation runs (unless already terminated) and the trial has started."""
    await conn.execute(
        """UPDATE tr_allocations
           SET state = CASE WHEN state = 'TERMINATED' THEN state ELSE 'RUNNING' END,
               started_at = coalesce(started_at, $2), agent_id = coalesce(agent_id, $3)
           WHERE allocation_id = $1""",
        e.allocation_id,
        at,
        e.agent_id,
    )
    await conn.execute(
        """UPDATE tr_trials SET started_at = coalesce(started_at, $2),
               run_id = greatest(run_id, $3)
           WHERE trial_id = $1""",
        e.trial_id,
        at,
        e.run_id,
    )


async def trial_exited(conn: Connection, e: TrialExited, at: datetime) -> None:
    """The allocation terminated with the trial's outcome and exit code."""
    await conn.execute(
        """UPDATE tr_allocations SET state = 'TERMINATED', outcome = $2, exit_code = $3,
               ended_at = coalesce(ended_at, $4)
           WHERE allocation_id = $1""",
        e.allocation_id,
        e.outcome,
        e.exit_code,
        at,
    )


async def slots_released(conn: Connection, e: SlotsReleased, at: datetime) -> None:
    """The allocation terminated and its slots are free."""
    await conn.execute(
        """UPDATE tr_allocations SET state = 'TERMINATED', ended_at = coalesce(ended_at, $2)
           WHERE allocation_id = $1""",
        e.allocation_id,
        at,
    )
    await conn.execute(
        "UPDATE tr_slots SET allocation_id = NULL WHERE allocation_id = $1",
        e.allocation_id,
    )
