"""Every fold of an experiment's or a trial's state applies the lifecycle's one rule set.

The same log, with illegal state changes in it, goes through each consumer that folds states:
the lifecycle replay, the typed aggregates (the API's views), the API's trial control view, the
scheduler's cluster state, the searcher, the log checker and the tracker's projections (rebuilt
on a real PostgreSQL). Each must end in the state the state machine allows, never in a state
a refused change names.
"""

from __future__ import annotations

from typing import Any

from events.domain import aggregates, lifecycle
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
from services.api.views import fold_trial_control
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
    return search.state, search.trial_states[TRIAL]


async def test_every_consumer_folds_the_same_states(store: EventStore) -> None:
    """One log with refused state changes in it folds to COMPLETED / CANCELED in every consumer
    (the lifecycle, aggregates, API control view, scheduler, searcher, log checker, tracker)."""
    events = await logged(store)
    exp_events = [e for e in events if e.stream_id == experiment_stream(EXPERIMENT)]
    trial_events = [e for e in events if e.stream_id == trial_stream(TRIAL)]

    life_exp = lifecycle.fold_experiment(exp_events)
    life_trial = lifecycle.fold_trial(trial_events)
    expected = (life_exp.state, life_trial.state)
    assert expected == ("COMPLETED", "CANCELED")
    # The fault this test is about happened: the log holds changes the state machine refuses.
    assert [r[1:] for r in life_exp.refused] == [
        ("STOPPING_COMPLETED", "PAUSED"),
        ("COMPLETED", "ERROR"),
    ]
    assert [r[1:] for r in life_trial.refused] == [
        ("STOPPING_KILLED", "STOPPING_CANCELED"),
        ("STOPPING_KILLED", "COMPLETED"),
        ("CANCELED", "ERROR"),
    ]
    assert {f.kind for f in await check_log(store)} == {"illegal-transition"}

    folds: dict[str, tuple[str, str]] = {}
    view = aggregates.fold_experiment(EXPERIMENT, exp_events)
    summary = aggregates.fold_trial_summary(view, TRIAL, trial_events)
    folds["aggregates"] = (view.state, aggregates.fold_trial(TRIAL, trial_events).state)
    folds["trial summary"] = (view.state, summary["state"])
    folds["api trial control"] = (view.state, fold_trial_control(TRIAL, trial_events).state)

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
