"""The tracker's projections: the ``tr_*`` tables of ``docs/tracking.md``, folded from the log.

Consumer ``tracker-projections`` applies each page of events (runs of metric reports in batches,
:mod:`services.tracker.batch`) inside the transaction that moves its checkpoint, so every table
is consistent with every other at each commit. Every timestamp is the
event's ``recorded_at`` (never ``now()``) and every rule depends only on the events in log order,
so :func:`rebuild` (truncate, replay from position 0) gives tables equal to the live ones.

This module holds the consumer and the dispatch; each fact's rule is in the module of its
aggregate: :mod:`~services.tracker.project_experiments`, :mod:`~services.tracker.project_trials`
(trials and allocations), :mod:`~services.tracker.project_metrics` (reports and checkpoints)
and :mod:`~services.tracker.project_agents`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import structlog

from events.domain.aggregates import AGENT_FACTS, EXPERIMENT_FACTS, SettingsChange
from events.domain.types import (
    AgentLost,
    AgentRegistered,
    CheckpointSaved,
    CheckpointsDeleted,
    ExperimentArchived,
    ExperimentContinued,
    ExperimentMoved,
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
from events.log.consumer import PageConsumer
from events.log.db import Connection
from events.log.envelope import Event, RecordedEvent
from events.log.errors import EventsError, StatementError
from events.log.store import EventStore, Transaction
from services.tracker import project_agents as agents
from services.tracker import project_experiments as experiments
from services.tracker import project_metrics as reports
from services.tracker import project_trials as trials
from services.tracker import schema, series
from services.tracker.batch import MetricRun, apply_run
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


class ProjectionsConsumer(PageConsumer):
    """Applies log events to the ``tr_*`` tables (consumer ``tracker-projections``)."""

    name = NAME
    projection = True
    types = TYPES

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
                if not (isinstance(payload, _BESIDE_RUN) and not run.holds(payload.trial_id)):
                    await _flush(tx.conn, run)
                await apply(tx.conn, payload, event.recorded_at, event.position)
            await _flush(tx.conn, run)
        except StatementError as exc:
            raise EventsError(
                f"projecting the page up to position {position} failed: {exc}"
            ) from exc
        await faults.point("tracker.page_applied")  # written, not yet committed with the checkpoint


_BESIDE_RUN = (CheckpointSaved, SlotsAllocated, SlotsReleased, TrialStarted, TrialExited)
"""Facts of one trial whose projection reads and writes only that trial's rows and the slots':
applied while a run of other trials' reports waits, they commute with it, so a log that
interleaves many trials' reports with these is still projected in long runs (a rebuild's
round trips, most of its time, fall several-fold)."""


async def _flush(conn: Connection, run: MetricRun) -> None:
    """Applies the waiting metric reports, then each validation's own effects in order."""
    if not run:
        return
    validations = await apply_run(conn, run)
    run.clear()
    if validations:
        await reports.validations_effects(conn, validations)


async def apply(conn: Connection, event: Event, at: datetime, position: int) -> None:
    """Applies one decoded event, recorded at ``at`` at log ``position``, to the projections."""
    if isinstance(event, ExperimentSubmitted):
        await experiments.experiment_submitted(conn, event, at, position)
    elif isinstance(event, ExperimentStateChanged):
        await experiments.experiment_state(conn, event, at)
    elif isinstance(event, ExperimentArchived):
        await experiments.experiment_archived(conn, event)
    elif isinstance(event, ExperimentMoved):
        await experiments.experiment_moved(conn, event)
    elif isinstance(event, SettingsChange):
        await experiments.experiment_setting(conn, event)
    elif isinstance(event, ExperimentContinued):
        await experiments.experiment_continued(conn, event)
    elif isinstance(event, TrialRequested):
        await trials.trial_requested(conn, event, at)
    elif isinstance(event, TrialStateChanged):
        await trials.trial_state(conn, event, at)
    elif isinstance(event, TrialRestarted):
        await trials.trial_restarted(conn, event)
    elif isinstance(event, SlotsAllocated):
        await trials.slots_allocated(conn, event, at)
    elif isinstance(event, TrialStarted):
        await trials.trial_started(conn, event, at)
    elif isinstance(event, TrialExited):
        await trials.trial_exited(conn, event, at)
    elif isinstance(event, SlotsReleased):
        await trials.slots_released(conn, event, at)
    elif isinstance(event, WorkloadCompleted | ValidationReported | MetricsReported):
        await reports.metrics(conn, event, at)
    elif isinstance(event, CheckpointSaved):
        await reports.checkpoint_saved(conn, event, at)
    elif isinstance(event, CheckpointsDeleted):
        await reports.checkpoints_deleted(conn, event, at)
    elif isinstance(event, AgentRegistered):
        await agents.agent_registered(conn, event, at)
    elif isinstance(event, AgentLost):
        await agents.agent_lost(conn, event, at)
    elif isinstance(event, SlotsDisabled | SlotsEnabled):
        await agents.slots_toggled(conn, event)


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
    with series.deferred_buckets() as noted:

        async def finish(tx: Transaction) -> None:
            await series.roll_up_deferred(tx.conn, noted)

        applied = await rebuild_consumer(
            store, ProjectionsConsumer(), schema.TABLES, batch=batch, finish=finish
        )
    log.info("projections rebuilt", events=applied)
    return applied
