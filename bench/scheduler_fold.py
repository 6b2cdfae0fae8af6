"""Scheduler fold: :meth:`ClusterState.apply` over a synthetic log, in memory (no database).

The log is what the scheduler replays on a rebuild: agents registering, then experiments of 5
trials, each trial allocated, started, validated and checkpointed 4 times, exited, released and
completed (the validations are bare envelopes to the scheduler). Envelopes are built as the
store builds them (:func:`events.log.envelope.stored_event`), fresh for every run, and the fold
decodes each event it handles into its model. The baseline is decoding alone (the events of
the types it reads, no fold): the ratio shows what the fold adds to the decoding. Figures are
the best of 5 runs, in CPU time of this process.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from bench.common import BenchContext, Measure, Report, progress
from events.domain.types import (
    AgentRegistered,
    CheckpointSaved,
    ExperimentStateChanged,
    ExperimentSubmitted,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
)
from events.log.envelope import Event, RecordedEvent, stored_event, stored_metadata
from events.log.registry import encode
from services.scheduler.state import TYPES, ClusterState

RUNS = 5
AGENTS = 50
TRIALS_PER_EXPERIMENT = 5


def _rows(n_experiments: int) -> list[dict[str, Any]]:
    """The stored rows of the synthetic log."""
    rows: list[dict[str, Any]] = []
    versions: dict[str, int] = {}
    now = datetime.now(UTC)

    def add(stream_id: str, event: Event) -> None:
        versions[stream_id] = versions.get(stream_id, 0) + 1
        rows.append(
            {
                "position": len(rows) + 1,
                "stream_id": stream_id,
                "stream_version": versions[stream_id],
                "event_id": uuid.UUID(int=len(rows) + 1),
                "type": event.event_type,
                "schema_version": event.schema_version,
                "payload": encode(event),
                "recorded_at": now,
            }
        )

    slots = [{"slot_id": str(i)} for i in range(8)]
    for a in range(AGENTS):
        add(f"agent-a{a}", AgentRegistered.model_validate({"agent_id": f"a{a}", "slots": slots}))
    trial_id = 0
    for exp in range(1, n_experiments + 1):
        stream = f"experiment-{exp}"
        config = {"resources": {"slots_per_trial": 1}, "max_restarts": 3}
        add(stream, ExperimentSubmitted(experiment_id=exp, config=config))
        for seq in range(TRIALS_PER_EXPERIMENT):
            trial_id += 1
            add(
                stream,
                TrialRequested(
                    experiment_id=exp,
                    trial_id=trial_id,
                    seq=seq,
                    request_id=f"r{seq:04d}",
                    hparams={"lr": 0.1},
                    trial_seed=seq,
                ),
            )
            trial, alloc, agent = f"trial-{trial_id}", f"{trial_id}.1", f"a{trial_id % AGENTS}"
            placements = {agent: [str(trial_id % 8)]}
            add(
                trial, SlotsAllocated(trial_id=trial_id, allocation_id=alloc, placements=placements)
            )
            add(
                trial,
                TrialStarted(trial_id=trial_id, allocation_id=alloc, run_id=1, agent_id=agent),
            )
            for step in range(1, 5):
                metrics = {"loss": 1.0 / step}
                add(
                    trial,
                    ValidationReported(
                        trial_id=trial_id, run_id=1, steps_completed=step, metrics=metrics
                    ),
                )
                checkpoint = str(uuid.UUID(int=trial_id * 10 + step))
                add(
                    trial,
                    CheckpointSaved(
                        trial_id=trial_id, run_id=1, uuid=checkpoint, steps_completed=step
                    ),
                )
            add(
                trial,
                TrialExited(trial_id=trial_id, run_id=1, allocation_id=alloc, outcome="completed"),
            )
            add(trial, SlotsReleased(trial_id=trial_id, allocation_id=alloc, placements=placements))
            add(trial, TrialStateChanged(trial_id=trial_id, state="COMPLETED"))
        add(stream, ExperimentStateChanged(experiment_id=exp, state="COMPLETED"))
    return rows


def _envelopes(rows: Sequence[dict[str, Any]]) -> list[RecordedEvent]:
    """Fresh envelopes of ``rows``, as the store's reads build them."""
    return [stored_event({**row, "metadata": stored_metadata(None)}) for row in rows]


def _best(rows: Sequence[dict[str, Any]], work: Any) -> float:
    """The best CPU seconds of :data:`RUNS` runs of ``work`` over fresh envelopes."""
    best = float("inf")
    for _ in range(RUNS):
        events = _envelopes(rows)
        started = time.process_time()
        work(events)
        best = min(best, time.process_time() - started)
    return best


def _fold(events: list[RecordedEvent]) -> None:
    state = ClusterState()
    for event in events:
        state.apply(event)


def _decode(events: list[RecordedEvent]) -> None:
    for event in events:
        if event.type in TYPES:
            event.decode()


async def run(ctx: BenchContext) -> Report:
    """Times the scheduler's fold and decoding alone; returns their rates."""
    n_experiments = ctx.scaled(2000)
    rows = _rows(n_experiments)
    progress(f"scheduler fold: {len(rows):,} events, {n_experiments:,} experiments")
    fold = _best(rows, _fold)
    decode = _best(rows, _decode)
    count = len(rows)
    progress(f"  fold {1e6 * fold / count:.2f} us/event, decoding alone {1e6 * decode / count:.2f}")
    report = Report()
    report.measures.append(
        Measure(
            f"scheduler fold {count:,}",
            count / fold,
            count / decode,
            "decoding alone",
            count=count,
            notes="CPU time, best of 5, in memory",
        )
    )
    report.details["us_per_event"] = {
        "fold": round(1e6 * fold / count, 3),
        "decode": round(1e6 * decode / count, 3),
    }
    return report
