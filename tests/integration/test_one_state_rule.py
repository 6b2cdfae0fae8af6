"""One fold per aggregate: every consumer holds the same experiment and trial state.

The same log, with illegal state changes in it, goes through each consumer that folds states.
The API's views, the scheduler's cluster, the searcher and the log checker all apply the folds
of :mod:`events.domain.aggregates`; the tracker's projections (rebuilt on a real PostgreSQL) are
SQL written to the same rules. Each must end in the state the state machine allows, never in a
state a refused change names.
"""

from __future__ import annotations

from typing import Any

from events.domain import aggregates
from events.domain.check import check_log
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialRequested,
    TrialStateChanged,
)
from events.log.envelope import Event, RecordedEvent
from events.log.store import EventStore
from services.scheduler.state import ClusterState
from services.searcher.service import TYPES as SEARCHER_TYPES
from services.searcher.service import SearcherConsumer
from services.tracker import projections

EXPERIMENT, TRIAL = 5, 9

CONFIG: dict[str, Any] = {
    "name": "one-rule",
    "searcher": {"name": "single", "metric": "loss", "max_length": {"batches": 10}},
    "hyperparameters": {"lr": 0.1},
}


def experiment_changes() -> list[Event]:
    """Submitted, paused, resumed, stopping; then a refused PAUSED, the legal COMPLETED and a
    refused ERROR (an ended experiment never errors)."""
    return [
        ExperimentSubmitted(experiment_id=EXPERIMENT, config=CONFIG, owner="alice"),
        TrialRequested(
            experiment_id=EXPERIMENT,
            trial_id=TRIAL,
            seq=1,
            request_id="r0001",
            hparams={"lr": 0.1},
            trial_seed=1,
        ),
        *(
            ExperimentStateChanged(experiment_id=EXPERIMENT, state=state)
            for state in ("PAUSED", "ACTIVE", "STOPPING_COMPLETED", "PAUSED", "COMPLETED", "ERROR")
        ),
    ]


def trial_changes() -> list[Event]:
    """A requeue (ACTIVE stays ACTIVE), a kill's stopping state, a refused milder stopping state,
    a refused COMPLETED, the legal CANCELED and a refused ERROR after it."""
    return [
        TrialStateChanged(trial_id=TRIAL, state=state, reason=reason)
        for state, reason in (
            ("ACTIVE", "requeue"),
            ("STOPPING_KILLED", ""),
            ("STOPPING_CANCELED", ""),
            ("COMPLETED", ""),
            ("CANCELED", ""),
            ("ERROR", ""),
        )
    ]


async def logged(store: EventStore) -> list[RecordedEvent]:
    """Appends both streams to the log and reads the whole log back (upcast at the read)."""
    await store.append(experiment_stream(EXPERIMENT), experiment_changes())
    await store.append(trial_stream(TRIAL), trial_changes())
    return [e async for e in store.iter_all()]


def searcher_states(events: list[RecordedEvent]) -> tuple[str, str]:
    """The experiment's and the trial's state as the searcher folds them."""
    consumer = SearcherConsumer(None)  # type: ignore[arg-type]  # apply never reads the store
    for event in events:
        if event.type in SEARCHER_TYPES:
            consumer.apply(event)
    search = consumer.searches[EXPERIMENT]
    return search.state, search.trial_views[TRIAL].state


async def test_every_consumer_folds_the_same_states(store: EventStore) -> None:
    """One log with refused state changes in it folds to COMPLETED / CANCELED in every consumer
    (the folds, the trial summary, the scheduler, the searcher, the log checker, the tracker)."""
    events = await logged(store)
    exp_events = [e for e in events if e.stream_id == experiment_stream(EXPERIMENT)]
    trial_events = [e for e in events if e.stream_id == trial_stream(TRIAL)]

    view = aggregates.ExperimentView(EXPERIMENT)
    refused_exp = [e.position for e in exp_events if not aggregates.apply_experiment(view, e)]
    trial = aggregates.TrialView(TRIAL)
    refused_trial = [e.position for e in trial_events if not aggregates.apply_trial(trial, e)]
    expected = (view.state, trial.state)
    assert expected == ("COMPLETED", "CANCELED")
    # The fault this test is about happened: the log holds changes the state machine refuses
    # (the submission and the request are applied; the refused changes are not).
    assert len(refused_exp) == 2 and len(refused_trial) == 3
    assert {f.kind for f in await check_log(store)} == {"illegal-transition"}

    folds: dict[str, tuple[str, str]] = {}
    summary = aggregates.fold_trial_summary(view, TRIAL, trial_events)
    folds["trial summary"] = (view.state, summary["state"])

    cluster = ClusterState()
    for event in events:
        cluster.apply(event)
    folds["scheduler"] = (cluster.experiments[EXPERIMENT].state, cluster.trials[TRIAL].state)
    folds["searcher"] = searcher_states(events)

    await projections.rebuild(store)
    async with store.connection() as conn:
        folds["tracker"] = (
            await conn.fetchval(
                "SELECT state FROM tr_experiments WHERE experiment_id = $1", EXPERIMENT
            ),
            await conn.fetchval("SELECT state FROM tr_trials WHERE trial_id = $1", TRIAL),
        )

    assert folds == dict.fromkeys(folds, expected)
    assert view.ended_at is not None and summary["ended_at"] is not None
