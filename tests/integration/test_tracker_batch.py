"""Batched projection of metric reports (``services/tracker/batch.py``) equals applying the same
log one event at a time, on random report sequences with restarts, rollbacks, repeats,
validations, checkpoints and runs' starts and ends interleaved across trials, for any page
size."""

from __future__ import annotations

import itertools
import os
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from events.domain.config import parse_config
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    CheckpointSaved,
    ExperimentSubmitted,
    MetricsReported,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialStarted,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.consumer import ConsumerRunner
from events.log.envelope import Event
from events.log.store import EventStore
from services.tracker import projections, schema
from tests.integration.test_api_support import CONFIG
from tests.integration.test_tracker import snapshot

_ids = itertools.count(1)
EXAMPLES = int(os.environ.get("CAIRN_PROPERTY_EXAMPLES", "3"))
"""Random logs per run: a few in ``make test``, many in ``make property``."""

reports = st.lists(
    st.tuples(
        st.integers(0, 2),  # trial
        st.integers(1, 3),  # run
        st.sampled_from(["training", "validation", "custom", "checkpoint", "start", "end"]),
        st.integers(0, 12),  # steps
        st.floats(0, 10, allow_nan=False),  # loss
    ),
    min_size=1,
    max_size=40,
)


def lifecycle(trial: int, run: int, kind: str) -> list[Event]:
    """The facts of a run's start (allocation, start) or end (exit, release)."""
    allocation = f"a-{trial}-{run}"
    placements = {"agent-1": ["slot-0"]}
    if kind == "start":
        return [
            SlotsAllocated(trial_id=trial, allocation_id=allocation, placements=placements),
            TrialStarted(trial_id=trial, allocation_id=allocation, run_id=run, agent_id="agent-1"),
        ]
    return [
        TrialExited(trial_id=trial, run_id=run, allocation_id=allocation, outcome="completed"),
        SlotsReleased(trial_id=trial, allocation_id=allocation, placements=placements),
    ]


def report(trial: int, run: int, kind: str, steps: int, loss: float) -> Event:
    """The fact a trial appends for one report."""
    metrics = {"loss": loss, "acc": steps}
    if kind == "training":
        return WorkloadCompleted(trial_id=trial, run_id=run, steps_completed=steps, metrics=metrics)
    if kind == "validation":
        return ValidationReported(
            trial_id=trial, run_id=run, steps_completed=steps, metrics=metrics
        )
    if kind == "custom":
        return MetricsReported(
            trial_id=trial, run_id=run, steps_completed=steps, metrics=metrics, group="custom"
        )
    return CheckpointSaved(
        trial_id=trial, run_id=run, steps_completed=steps, uuid=f"ck-{trial}-{run}-{steps}"
    )


async def one_by_one(store: EventStore) -> dict[str, list[dict[str, Any]]]:
    """The projections as applying every event alone (``projections.apply``) builds them."""
    async with store.transaction() as tx:
        await tx.conn.execute(f"TRUNCATE {', '.join(schema.TABLES)}")
        for event in await tx.read_all(0, limit=1_000_000, types=projections.TYPES):
            await projections.apply(tx.conn, event.decode(), event.recorded_at, event.position)
    return await snapshot(store)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=reports, page=st.integers(1, 9))
# Within one batch: a trial's last validation is its latest, a checkpoint gets the last
# validation of its step, and an experiment's best stays with the first trial that reached it.
@example(
    sequence=[
        (0, 1, "checkpoint", 2, 0.0),
        (0, 1, "validation", 2, 1.0),
        (0, 1, "validation", 2, 3.0),
        (0, 1, "validation", 5, 2.0),
        (1, 1, "validation", 1, 1.0),
        (2, 1, "validation", 1, 4.0),
    ],
    page=9,
)
async def test_batched_pages_equal_one_event_at_a_time(
    store: EventStore, sequence: list[tuple[int, int, str, int, float]], page: int
) -> None:
    """Projecting pages of ``page`` events (and a whole-log rebuild) gives tables equal to
    applying each event alone, whatever mix of runs, rollbacks and repeats the log holds."""
    await schema.migrate(store)
    exp = next(_ids)
    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    await store.append(
        experiment_stream(exp), [ExperimentSubmitted(experiment_id=exp, config=config)]
    )
    trials = [exp * 100 + i for i in range(3)]
    await store.append(
        experiment_stream(exp),
        [
            TrialRequested(
                experiment_id=exp,
                trial_id=t,
                seq=i + 1,
                request_id=f"r{t}",
                hparams={},
                trial_seed=1,
            )
            for i, t in enumerate(trials)
        ],
    )
    for trial, run, kind, steps, loss in sequence:
        if kind == "checkpoint" and steps % 2:  # a few checkpoints, the rest validations
            kind = "validation"
        facts = (
            lifecycle(trials[trial], run, kind)
            if kind in ("start", "end")
            else [report(trials[trial], run, kind, steps, loss)]
        )
        await store.append(trial_stream(trials[trial]), facts)

    expected = await one_by_one(store)
    await projections.rebuild(store)
    assert await snapshot(store) == expected

    async with store.transaction() as tx:
        await tx.conn.execute(f"TRUNCATE {', '.join(schema.TABLES)}")
        await tx.conn.execute(
            "UPDATE checkpoints SET position = 0 WHERE name = $1", projections.NAME
        )
    await ConsumerRunner(store, None, projections.ProjectionsConsumer(), batch=page).catch_up()
    assert await snapshot(store) == expected
