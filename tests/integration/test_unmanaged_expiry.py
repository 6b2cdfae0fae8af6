"""The expiry of silent unmanaged runs against a real PostgreSQL: decided once however many
gateways decide at the same moment, and never for a run heard from within the timeout."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from events.domain import lifecycle
from events.domain.aggregates import TrialView, fold_trial
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import ExperimentSubmitted
from events.domain.unmanaged import open_run, request_trial
from events.log.envelope import new
from events.log.store import EventStore
from services.api import tables
from services.api.routes_unmanaged import expire_silent_runs

TIMEOUT = timedelta(seconds=30)


async def open_trial(store: EventStore, trial_id: int, *, silent_for: timedelta) -> None:
    """An unmanaged experiment whose trial ``trial_id`` has run 1 open, last heard from
    ``silent_for`` ago."""
    experiment_id = trial_id
    submitted = ExperimentSubmitted(
        experiment_id=experiment_id, config={}, owner="alice", unmanaged=True, external_id="e"
    )
    requested = request_trial(
        experiment_id=experiment_id, trial_id=trial_id, seq=1, external_id="t", hparams={}
    )
    await store.append(
        experiment_stream(experiment_id), [new(submitted), new(requested)], expected_version=0
    )
    events, run_id = open_run(TrialView(trial_id))
    await store.append(trial_stream(trial_id), [new(e) for e in events], expected_version=0)
    await store.execute(
        "INSERT INTO unmanaged_heartbeats (trial_id, run_id, seen_at) "
        "VALUES ($1, $2, now() - $3::interval)",
        trial_id,
        run_id,
        silent_for,
    )


async def test_a_silent_run_is_expired_once_by_racing_gateways_and_a_live_one_is_not(
    store: EventStore,
) -> None:
    """Four concurrent expiry passes end the silent run once (one TrialExited lost, trial
    ERROR, one pass reports it); the run heard from 1 s ago stays open."""
    await tables.migrate(store)
    await open_trial(store, 101, silent_for=timedelta(minutes=5))
    await open_trial(store, 102, silent_for=timedelta(seconds=1))
    results = await asyncio.gather(*(expire_silent_runs(store, TIMEOUT) for _ in range(4)))
    assert sorted(pair for result in results for pair in result) == [(101, 1)]
    silent = await store.read_stream(trial_stream(101))
    exits = [e.payload for e in silent if e.type == "TrialExited"]
    assert len(exits) == 1 and exits[0]["outcome"] == "lost"
    assert fold_trial(0, silent).state == lifecycle.ERROR
    alive = await store.read_stream(trial_stream(102))
    assert not [e for e in alive if e.type == "TrialExited"]
    assert await expire_silent_runs(store, TIMEOUT) == []
