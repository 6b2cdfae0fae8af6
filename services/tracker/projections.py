"""The tracker's projections: the ``tr_*`` tables of ``docs/tracking.md``, folded from the log.

Consumer ``tracker-projections`` applies each page of events (runs of metric reports in batches,
:mod:`services.tracker.batch`) inside the transaction that moves its checkpoint, so every table
is consistent with every other at each commit. Every timestamp is the
event's ``recorded_at`` (never ``now()``) and every rule depends only on the events in log order,
so :func:`rebuild` (truncate, replay from position 0) gives tables equal to the live ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import structlog

from events.domain.aggregates import AGENT_FACTS, EXPERIMENT_FACTS
from events.domain.lifecycle import (
    DELETED,
    TERMINAL,
    can_continue,
    initial_experiment_state,
    next_experiment_state,
    next_trial_state,
)
from events.domain.types import (
    AgentLost,
    AgentRegistered,
    CheckpointSaved,
    CheckpointsDeleted,
    ExperimentArchived,
    ExperimentContinued,
    ExperimentDescribed,
    ExperimentLabelsChanged,
    ExperimentRenamed,
    ExperimentResourcesChanged,
    ExperimentStateChanged,
    ExperimentSubmitted,
    MetricsReported,
    SlotsAllocated,
    SlotsDisabled,
    SlotsEnabled,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialRestarted,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
    WorkloadCompleted,
)
from events.log import faults
from events.log.consumer import Consumer
from events.log.db import Connection
from events.log.envelope import Event, RecordedEvent
from events.log.errors import EventsError, StatementError
from events.log.store import EventStore, Transaction
from services.tracker import schema, series
from services.tracker.batch import MetricRun, apply_run, group_of
from services.tracker.rebuild import rebuild_consumer

log = structlog.get_logger("tracker")

NAME = "tracker-projections"
TYPES = frozenset(
    {
        *EXPERIMENT_FACTS,
        "TrialStateChanged",
        "TrialRestarted",
        "SlotsAllocated",
        "TrialStarted",
        "TrialExited",
        "SlotsReleased",
        "WorkloadCompleted",
        "ValidationReported",
        "MetricsReported",
        "CheckpointSaved",
        "CheckpointsDeleted",
        *AGENT_FACTS,
    }
)
"""The event types the projections read; others only move the checkpoint."""


class ProjectionsConsumer(Consumer):
    """Applies log events to the ``tr_*`` tables (consumer ``tracker-projections``)."""

    name = NAME
    projection = True
    types = TYPES

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        """Applies one event to the projections inside the consumer's transaction.

        Raises:
            EventsError: the database refused a statement (the page is retried).
        """
        await self.handle_page(tx, [event])

    async def handle_page(self, tx: Transaction, events: Sequence[RecordedEvent]) -> None:
        """Applies a page in log order; runs of metric reports go in batches
        (:mod:`services.tracker.batch`), everything else one event at a time.

        Raises:
            EventsError: the database refused a statement (the page is retried).
        """
        run = MetricRun()
        position = events[0].position if events else 0
        try:
            for event in events:
                position = event.position
                try:
                    payload = event.decode()
                except Exception as exc:  # a payload the models reject: skip, never wedge
                    log.warning("event not projected", position=position, error=str(exc))
                    continue
                if isinstance(payload, WorkloadCompleted | ValidationReported | MetricsReported):
                    if not run.fits(payload):
                        await _flush(tx.conn, run)
                    run.add(payload, event.recorded_at)
                    continue
                await _flush(tx.conn, run)
                await apply(tx.conn, payload, event.recorded_at, event.position)
            await _flush(tx.conn, run)
        except StatementError as exc:
            raise EventsError(
                f"projecting the page up to position {position} failed: {exc}"
            ) from exc
        await faults.point("tracker.page_applied")  # written, not yet committed with the checkpoint


async def _flush(conn: Connection, run: MetricRun) -> None:
    """Applies the waiting metric reports, then each validation's own effects in order."""
    if not run:
        return
    validations = await apply_run(conn, run)
    run.clear()
    for event, experiment_id in validations:
        await _validation_effects(conn, event, experiment_id)


async def apply(conn: Connection, event: Event, at: datetime, position: int) -> None:
    """Applies one decoded event, recorded at ``at`` at log ``position``, to the projections."""
    if isinstance(event, ExperimentSubmitted):
        await _experiment_submitted(conn, event, at, position)
    elif isinstance(event, ExperimentStateChanged):
        await _experiment_state(conn, event, at)
    elif isinstance(event, ExperimentArchived):
        await conn.execute(
            "UPDATE tr_experiments SET archived = $2 WHERE experiment_id = $1",
            event.experiment_id,
            event.archived,
        )
    elif isinstance(
        event,
        ExperimentRenamed
        | ExperimentDescribed
        | ExperimentLabelsChanged
        | ExperimentResourcesChanged,
    ):
        await _experiment_settings(conn, event)
    elif isinstance(event, ExperimentContinued):
        await _experiment_continued(conn, event)
    elif isinstance(event, TrialRequested):
        await _trial_requested(conn, event, at)
    elif isinstance(event, TrialStateChanged):
        await _trial_state(conn, event, at)
    elif isinstance(event, TrialRestarted):
        await conn.execute(
            "UPDATE tr_trials SET restarts = $2 WHERE trial_id = $1",
            event.trial_id,
            event.restarts,
        )
    elif isinstance(event, SlotsAllocated):
        await _slots_allocated(conn, event, at)
    elif isinstance(event, TrialStarted):
        await _trial_started(conn, event, at)
    elif isinstance(event, TrialExited):
        await conn.execute(
            """UPDATE tr_allocations SET state = 'TERMINATED', outcome = $2, exit_code = $3,
                   ended_at = coalesce(ended_at, $4)
               WHERE allocation_id = $1""",
            event.allocation_id,
            event.outcome,
            event.exit_code,
            at,
        )
    elif isinstance(event, SlotsReleased):
        await conn.execute(
            """UPDATE tr_allocations SET state = 'TERMINATED', ended_at = coalesce(ended_at, $2)
               WHERE allocation_id = $1""",
            event.allocation_id,
            at,
        )
        await conn.execute(
            "UPDATE tr_slots SET allocation_id = NULL WHERE allocation_id = $1",
            event.allocation_id,
        )
    elif isinstance(event, WorkloadCompleted | ValidationReported | MetricsReported):
        await _metrics(conn, event, at)
    elif isinstance(event, CheckpointSaved):
        await _checkpoint_saved(conn, event, at)
    elif isinstance(event, CheckpointsDeleted):
        await conn.execute(
            """UPDATE tr_checkpoints SET state = 'DELETED', deleted_at = $2
               WHERE uuid = ANY($1::text[]) AND state <> 'DELETED'""",
            list(event.uuids),
            at,
        )
    elif isinstance(event, AgentRegistered):
        await _agent_registered(conn, event, at)
    elif isinstance(event, AgentLost):
        await conn.execute(
            "UPDATE tr_agents SET state = 'lost', lost_at = $2 WHERE agent_id = $1",
            event.agent_id,
            at,
        )
    elif isinstance(event, SlotsDisabled | SlotsEnabled):
        enabled = isinstance(event, SlotsEnabled)
        drain = isinstance(event, SlotsDisabled) and event.drain
        await conn.execute(
            """UPDATE tr_slots SET enabled = $3, draining = $4
               WHERE agent_id = $1 AND (cardinality($2::text[]) = 0 OR slot_id = ANY($2::text[]))""",
            event.agent_id,
            list(event.slot_ids),
            enabled,
            drain,
        )


async def experiment_of_trial(conn: Connection, trial_id: int) -> int | None:
    """The experiment of a projected trial (``None``: its ``TrialRequested`` was not projected,
    e.g. its experiment was deleted)."""
    value = await conn.fetchval("SELECT experiment_id FROM tr_trials WHERE trial_id = $1", trial_id)
    return None if value is None else int(value)


def metric_value(metrics: Mapping[str, Any], name: str | None) -> float | None:
    """The finite numeric value of metric ``name`` in ``metrics`` (``None`` if absent)."""
    if not name:
        return None
    value = metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


async def _experiment_submitted(
    conn: Connection, e: ExperimentSubmitted, at: datetime, position: int
) -> None:
    config = e.config
    searcher = _mapping(config.get("searcher"))
    resources = _mapping(config.get("resources"))
    labels = config.get("labels")
    max_trials = searcher.get("max_trials")
    await conn.execute(
        """INSERT INTO tr_experiments (experiment_id, name, description, labels, owner, state,
               archived, searcher_name, searcher_metric, smaller_is_better, max_trials, config,
               code_ref, resource_pool, num_trials, submitted_at, position, unmanaged)
           VALUES ($1, $2, $3, $4, $5, $6, false, $7, $8, $9, $10, $11, $12, $13, 0, $14, $15,
                   $16)
           ON CONFLICT (experiment_id) DO NOTHING""",
        e.experiment_id,
        str(config.get("name") or ""),
        str(config.get("description") or ""),
        list(labels) if isinstance(labels, list | tuple) else [],
        e.owner,
        initial_experiment_state(e.activate),
        str(searcher.get("name") or ""),
        str(searcher.get("metric") or ""),
        bool(searcher.get("smaller_is_better", True)),
        max_trials if isinstance(max_trials, int) and not isinstance(max_trials, bool) else None,
        config,
        e.code_ref,
        str(resources.get("resource_pool") or "default"),
        at,
        position,
        e.unmanaged,
    )


async def _experiment_state(conn: Connection, e: ExperimentStateChanged, at: datetime) -> None:
    current = await conn.fetchval(
        "SELECT state FROM tr_experiments WHERE experiment_id = $1", e.experiment_id
    )
    if current is None or next_experiment_state(str(current), e.state) is None:
        return  # refused by the state machine: never applied
    if e.state == DELETED:
        await delete_experiment(conn, e.experiment_id)
        return
    await conn.execute(
        """UPDATE tr_experiments
           SET state = $2, ended_at = CASE WHEN $2 = ANY($3::text[]) THEN $4 ELSE ended_at END
           WHERE experiment_id = $1""",
        e.experiment_id,
        e.state,
        sorted(TERMINAL),
        at,
    )


async def _experiment_settings(
    conn: Connection,
    e: ExperimentRenamed
    | ExperimentDescribed
    | ExperimentLabelsChanged
    | ExperimentResourcesChanged,
) -> None:
    """A user's change of name, description, labels or resources: the columns and the config."""
    if isinstance(e, ExperimentRenamed):
        column, path, value = "name", ["name"], e.name
    elif isinstance(e, ExperimentDescribed):
        column, path, value = "description", ["description"], e.description
    elif isinstance(e, ExperimentLabelsChanged):
        await conn.execute(
            """UPDATE tr_experiments
               SET labels = $2, config = jsonb_set(config, '{labels}', $2)
               WHERE experiment_id = $1""",
            e.experiment_id,
            list(e.labels),
        )
        return
    else:
        await conn.execute(
            """UPDATE tr_experiments
               SET config = jsonb_set(config, '{resources}',
                                      coalesce(config->'resources', '{}'::jsonb) || $2::jsonb)
               WHERE experiment_id = $1""",
            e.experiment_id,
            dict(e.resources),
        )
        return
    await conn.execute(
        f"""UPDATE tr_experiments
            SET {column} = $2, config = jsonb_set(config, $3::text[], to_jsonb($2::text))
            WHERE experiment_id = $1""",
        e.experiment_id,
        value,
        path,
    )


async def _experiment_continued(conn: Connection, e: ExperimentContinued) -> None:
    """An ended experiment is ACTIVE again with its new config, and its continued trials'
    hparams."""
    current = await conn.fetchval(
        "SELECT state FROM tr_experiments WHERE experiment_id = $1", e.experiment_id
    )
    if current is None or not can_continue(str(current)):
        return  # the folds refuse it too: never applied
    await conn.execute(
        """UPDATE tr_experiments SET state = 'ACTIVE', ended_at = NULL, config = $2,
               name = $3, description = $4
           WHERE experiment_id = $1""",
        e.experiment_id,
        e.config,
        str(e.config.get("name") or ""),
        str(e.config.get("description") or ""),
    )
    for trial in e.trials:
        await conn.execute(
            "UPDATE tr_trials SET hparams = $2 WHERE trial_id = $1", trial.trial_id, trial.hparams
        )


async def delete_experiment(conn: Connection, experiment_id: int) -> None:
    """Removes every row of an experiment from every ``tr_*`` table."""
    await conn.execute(
        """UPDATE tr_slots SET allocation_id = NULL
           WHERE allocation_id IN
               (SELECT allocation_id FROM tr_allocations WHERE experiment_id = $1)""",
        experiment_id,
    )
    for table in reversed(schema.TABLES):
        if table in ("tr_agents", "tr_slots"):
            continue
        await conn.execute(f"DELETE FROM {table} WHERE experiment_id = $1", experiment_id)


async def _trial_requested(conn: Connection, e: TrialRequested, at: datetime) -> None:
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


async def _trial_state(conn: Connection, e: TrialStateChanged, at: datetime) -> None:
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


async def _slots_allocated(conn: Connection, e: SlotsAllocated, at: datetime) -> None:
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


async def _trial_started(conn: Connection, e: TrialStarted, at: datetime) -> None:
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


def validation_doc(run_id: int, steps_completed: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON kept as a trial's ``latest_validation`` and a checkpoint's ``validation``."""
    return {"run_id": run_id, "steps_completed": steps_completed, "metrics": dict(metrics)}


async def _metrics(
    conn: Connection,
    e: WorkloadCompleted | ValidationReported | MetricsReported,
    at: datetime,
) -> None:
    experiment_id = await experiment_of_trial(conn, e.trial_id)
    if experiment_id is None:
        return
    # One statement: upsert the point (a repeat un-archives it), apply Determined's rollback
    # (a run reporting at step s archives earlier runs' rows beyond s, every group), and move
    # the trial's steps_completed (back to s when this report rolled something back).
    await conn.execute(
        """WITH ins AS (
               INSERT INTO tr_metrics (trial_id, experiment_id, run_id, "group", steps_completed,
                                       metrics, archived, reported_at)
               VALUES ($1, $2, $3, $4, $5, $6, false, $7)
               ON CONFLICT (trial_id, run_id, "group", steps_completed) DO UPDATE
               SET metrics = excluded.metrics, archived = false,
                   reported_at = excluded.reported_at
               RETURNING 1),
           arch AS (
               UPDATE tr_metrics SET archived = true
               WHERE trial_id = $1 AND run_id < $3 AND steps_completed > $5 AND NOT archived
               RETURNING 1)
           UPDATE tr_trials
           SET steps_completed = CASE WHEN EXISTS (SELECT 1 FROM arch) THEN $5
                                      ELSE greatest(steps_completed, $5) END
           WHERE trial_id = $1 AND EXISTS (SELECT 1 FROM ins)""",
        e.trial_id,
        experiment_id,
        e.run_id,
        group_of(e),
        e.steps_completed,
        dict(e.metrics),
        at,
    )
    if await conn.fetchval(
        "SELECT state = ANY($2::text[]) FROM tr_trials WHERE trial_id = $1",
        e.trial_id,
        sorted(TERMINAL),
    ):
        await series.roll_up_reported(conn, [e.trial_id])
    if isinstance(e, ValidationReported):
        await _validation_effects(conn, e, experiment_id)


async def _validation_effects(conn: Connection, e: ValidationReported, experiment_id: int) -> None:
    """A validation's effects beyond its point: the trial's latest and best validation, the
    checkpoint of the same step, and the experiment's best trial."""
    row = await conn.fetchrow(
        "SELECT searcher_metric, smaller_is_better FROM tr_experiments WHERE experiment_id = $1",
        experiment_id,
    )
    name = str(row["searcher_metric"]) if row is not None else ""
    smaller = bool(row["smaller_is_better"]) if row is not None else True
    value = metric_value(e.metrics, name)
    doc = validation_doc(e.run_id, e.steps_completed, e.metrics)
    await conn.execute(
        """UPDATE tr_trials SET latest_validation = $2,
               best_metric = CASE WHEN $3::float8 IS NULL THEN best_metric
                                  WHEN best_metric IS NULL THEN $3::float8
                                  WHEN $4 THEN least(best_metric, $3::float8)
                                  ELSE greatest(best_metric, $3::float8) END
           WHERE trial_id = $1""",
        e.trial_id,
        doc,
        value,
        smaller,
    )
    await conn.execute(
        """UPDATE tr_checkpoints SET validation = $3, searcher_metric = $4
           WHERE trial_id = $1 AND steps_completed = $2""",
        e.trial_id,
        e.steps_completed,
        doc,
        value,
    )
    if value is not None:
        await conn.execute(
            """UPDATE tr_experiments SET best_metric = $3, best_trial_id = $2
               WHERE experiment_id = $1
                 AND (best_metric IS NULL OR ($4 AND $3 < best_metric)
                      OR (NOT $4 AND $3 > best_metric))""",
            experiment_id,
            e.trial_id,
            value,
            smaller,
        )


async def _checkpoint_saved(conn: Connection, e: CheckpointSaved, at: datetime) -> None:
    experiment_id = await experiment_of_trial(conn, e.trial_id)
    if experiment_id is None:
        return
    validation = await conn.fetchrow(
        """SELECT run_id, steps_completed, metrics FROM tr_metrics
           WHERE trial_id = $1 AND "group" = 'validation' AND steps_completed = $2
           ORDER BY run_id DESC LIMIT 1""",
        e.trial_id,
        e.steps_completed,
    )
    doc: dict[str, Any] | None = None
    value: float | None = None
    if validation is not None:
        doc = validation_doc(
            int(validation["run_id"]), int(validation["steps_completed"]), validation["metrics"]
        )
        name = await conn.fetchval(
            "SELECT searcher_metric FROM tr_experiments WHERE experiment_id = $1", experiment_id
        )
        value = metric_value(validation["metrics"], str(name) if name else None)
    await conn.execute(
        """INSERT INTO tr_checkpoints (uuid, trial_id, experiment_id, run_id, steps_completed,
                                      resources, metadata, state, reported_at, validation,
                                      searcher_metric)
           VALUES ($1, $2, $3, $4, $5, $6, $7, 'COMPLETED', $8, $9, $10)
           ON CONFLICT (uuid) DO NOTHING""",
        e.uuid,
        e.trial_id,
        experiment_id,
        e.run_id,
        e.steps_completed,
        dict(e.resources),
        dict(e.metadata),
        at,
        doc,
        value,
    )
    await conn.execute(
        "UPDATE tr_trials SET latest_checkpoint = $2 WHERE trial_id = $1", e.trial_id, e.uuid
    )


async def _agent_registered(conn: Connection, e: AgentRegistered, at: datetime) -> None:
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


async def rebuild(store: EventStore, *, batch: int = 5000) -> int:
    """Truncates the projections, resets their checkpoint and replays the log to its head.

    Everything happens in one transaction holding the consumer's checkpoint lock, so a live
    tracker waits and readers never see half-built tables.

    Args:
        store: the event store.
        batch: events read per page.

    Returns:
        How many events were applied.
    """
    await schema.migrate(store)
    applied = await rebuild_consumer(store, ProjectionsConsumer(), schema.TABLES, batch=batch)
    log.info("projections rebuilt", events=applied)
    return applied
