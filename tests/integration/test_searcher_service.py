"""The searcher service over a real log: decisions are events, replay is exact, restarts are seamless."""

from __future__ import annotations

import math
from typing import Any

from events.check import check_log
from events.consumer import ConsumerRunner
from events.names import trial_stream
from events.store import EventStore
from events.types import (
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialStateChanged,
    ValidationReported,
)
from services.searcher.service import SearcherConsumer

CONFIG: dict[str, Any] = {
    "name": "asha",
    "entrypoint": "python3 train.py",
    "hyperparameters": {
        "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
        "hidden": {"type": "int", "minval": 8, "maxval": 64},
    },
    "searcher": {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "time_metric": "batches",
        "max_time": 64,
        "max_trials": 12,
        "max_concurrent_trials": 4,
        "mode": "aggressive",
    },
    "reproducibility": {"experiment_seed": 1234},
}


def loss(hparams: dict[str, Any], batches: int) -> float:
    """A scripted learning curve: better with more batches and an lr near 1e-2."""
    return abs(math.log10(hparams["lr"]) + 2) + 10.0 / (batches + 1) + hparams["hidden"] / 1000


async def simulate(
    store: EventStore,
    restart_at: set[int] = frozenset(),  # type: ignore[assignment]
    wake_ups: bool = False,
) -> list[tuple[Any, ...]]:
    """Drives the experiment to the end with scripted metrics; returns every searcher decision.

    With ``wake_ups`` each round is driven like the bus does: one catch-up per new position,
    below the searcher's own decisions of the previous round, and each twice."""
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=CONFIG)])
    consumer = SearcherConsumer(store)
    runner = ConsumerRunner(store, None, consumer)
    progress: dict[str, int] = {}
    for round_no in range(200):
        if round_no in restart_at:
            consumer = SearcherConsumer(store)  # a fresh process: it knows only the log
            await consumer.rebuild()
            runner = ConsumerRunner(store, None, consumer)
        if wake_ups:
            for position in range(await store.checkpoint("searcher") + 1, await store.head() + 1):
                await runner.catch_up(upto=position)
                await runner.catch_up(upto=position)
        await runner.catch_up()
        events = await store.read_all(limit=100_000)
        requested = {e.payload["trial_id"]: e.payload for e in events if e.type == "TrialRequested"}
        stopped = {e.payload["trial_id"] for e in events if e.type == "TrialStopRequested"}
        closed = {e.payload["trial_id"] for e in events if e.type == "TrialStateChanged"}
        if any(e.type == "ExperimentStateChanged" for e in events):
            break
        for trial_id, req in sorted(requested.items()):
            if trial_id in closed:
                continue
            batches = progress.get(trial_id, 0)
            if trial_id in stopped or batches >= 64:
                await store.append(
                    trial_stream(trial_id),
                    [TrialStateChanged(trial_id=trial_id, state="COMPLETED")],
                )
                continue
            batches += 4
            progress[trial_id] = batches
            metrics = {"validation_loss": loss(req["hparams"], batches), "batches": batches}
            await store.append(
                trial_stream(trial_id),
                [
                    ValidationReported(
                        trial_id=trial_id, run_id=1, steps_completed=batches, metrics=metrics
                    )
                ],
            )
    else:
        raise AssertionError("experiment did not finish")
    return [
        (
            e.type,
            e.payload.get("trial_id"),
            e.payload.get("hparams"),
            e.payload.get("trial_seed"),
            e.payload.get("state"),
        )
        for e in await store.read_all(limit=100_000)
        if e.type in ("TrialRequested", "TrialStopRequested", "ExperimentStateChanged")
    ]


async def test_asha_search_runs_to_completion_with_early_stops(store: EventStore) -> None:
    """An adaptive ASHA search requests max_trials trials, stops some early, then completes."""
    decisions = await simulate(store)
    requested = [d for d in decisions if d[0] == "TrialRequested"]
    stops = [d for d in decisions if d[0] == "TrialStopRequested"]
    assert len(requested) == 12
    assert len({d[1] for d in requested}) == 12
    assert stops, "ASHA stopped trials"
    validations: dict[str, int] = {}
    for e in await store.read_all(limit=100_000, types=["ValidationReported"]):
        validations[e.payload["trial_id"]] = e.payload["steps_completed"]
    trained = sorted(validations.values())
    assert trained[0] < 64 <= trained[-1], (
        "some trials stopped at a low rung, some reached max_time"
    )
    assert decisions[-1][0] == "ExperimentStateChanged" and decisions[-1][4] == "STOPPING_COMPLETED"


async def test_same_seed_same_decisions(db_url: str, pg_server: Any) -> None:
    """Two runs with the same seed and the same event order make identical decisions."""
    import asyncpg

    results = []
    for _ in range(2):
        name = f"s_{len(results)}_{abs(hash(db_url)) % 10_000}"
        conn = await asyncpg.connect(pg_server.url)
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.close()
        store = await EventStore.connect(pg_server.url.rsplit("/", 1)[0] + f"/{name}")
        results.append(await simulate(store))
        await store.close()
    assert results[0] == results[1]


async def test_restarted_searcher_makes_the_same_decisions(db_url: str, pg_server: Any) -> None:
    """A searcher restarted (replayed from the log) mid-experiment ends with the same trials as one that never stopped."""
    import asyncpg

    results = []
    for restarts in (set(), {3, 7, 11, 20}):
        name = f"r_{len(results)}_{abs(hash(db_url)) % 10_000}"
        conn = await asyncpg.connect(pg_server.url)
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.close()
        store = await EventStore.connect(pg_server.url.rsplit("/", 1)[0] + f"/{name}")
        results.append(await simulate(store, restarts))
        await store.close()
    assert results[0] == results[1]
    requests = [d[1] for d in results[1] if d[0] == "TrialRequested"]
    assert len(requests) == len(set(requests)), "no decision was emitted twice"


async def test_wake_ups_below_its_own_decisions_decide_nothing_twice(store: EventStore) -> None:
    """Bus wake-ups at every position, below the searcher's own decisions and repeated, request
    each trial once and stop each trial at most once (its decisions follow its inputs, each
    applied once, so no plan can miss an earlier decision)."""
    decisions = await simulate(store, wake_ups=True)
    requested = [d[1] for d in decisions if d[0] == "TrialRequested"]
    stopped = [d[1] for d in decisions if d[0] == "TrialStopRequested"]
    assert len(requested) == 12 and len(set(requested)) == 12
    assert stopped and len(stopped) == len(set(stopped))
    events = await store.read_all(limit=100_000, types=["TrialRequested"])
    assert len({e.payload["request_id"] for e in events}) == 12


async def test_search_end_overtaken_by_a_user_kill_is_not_appended(store: EventStore) -> None:
    """A kill recorded after the searcher's input but before its append wins: no STOPPING_COMPLETED."""
    single = {**CONFIG, "searcher": {"name": "single", "metric": "validation_loss"}}
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=single)])
    runner = ConsumerRunner(store, None, SearcherConsumer(store))
    await runner.catch_up()
    (requested,) = [e for e in await store.read_all() if e.type == "TrialRequested"]
    trial_id = requested.payload["trial_id"]
    # The input that ends the search, then the user's kill, both before the searcher runs.
    await store.append(
        trial_stream(trial_id), [TrialStateChanged(trial_id=trial_id, state="COMPLETED")]
    )
    kill = ExperimentStateChanged(experiment_id=1, state="STOPPING_KILLED", actor="alice")
    await store.append("experiment-1", [kill])
    await runner.catch_up()
    states = [
        e.payload["state"]
        for e in await store.read_stream("experiment-1")
        if e.type == "ExperimentStateChanged"
    ]
    assert states == ["STOPPING_KILLED"]
    assert await check_log(store) == []
