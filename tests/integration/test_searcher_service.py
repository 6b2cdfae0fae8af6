"""The searcher service over a real log: decisions are events, replay is exact, restarts are seamless."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from structlog.testing import capture_logs

from events.domain.check import check_log
from events.domain.names import trial_stream
from events.domain.search import TPEStrategy
from events.domain.types import (
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialRequested,
    TrialStateChanged,
    ValidationReported,
)
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
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
    config: dict[str, Any] = CONFIG,
    on_rebuild: Callable[[SearcherConsumer], None] | None = None,
) -> list[tuple[Any, ...]]:
    """Drives the experiment to the end with scripted metrics; returns every searcher decision.

    With ``wake_ups`` each round is driven like the bus does: one catch-up per new position,
    below the searcher's own decisions of the previous round, and each twice. ``on_rebuild``
    sees each restarted consumer right after its replay."""
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=config)])
    consumer = SearcherConsumer(store)
    runner = ConsumerRunner(store, None, consumer)
    progress: dict[str, int] = {}
    for round_no in range(200):
        if round_no in restart_at:
            consumer = SearcherConsumer(store)  # a fresh process: it knows only the log
            await consumer.rebuild()
            if on_rebuild is not None:
                on_rebuild(consumer)
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


TPE_CONFIG: dict[str, Any] = {
    **CONFIG,
    "name": "tpe",
    "searcher": {
        "name": "tpe",
        "metric": "validation_loss",
        "max_trials": 10,
        "max_concurrent_trials": 2,
        "n_startup_trials": 3,
    },
}


async def _fresh_store(pg_server: Any, name: str) -> EventStore:
    import asyncpg

    conn = await asyncpg.connect(pg_server.url)
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    return await EventStore.connect(pg_server.url.rsplit("/", 1)[0] + f"/{name}")


async def test_restarted_tpe_searcher_suggests_what_an_unbroken_one_would(
    db_url: str, pg_server: Any
) -> None:
    """A TPE searcher restarted mid-search (after TPE took over from the startup trials) rebuilds
    its sampler from the log and requests exactly the hyperparameters a fault-free run requests."""
    told_at_restart: list[int] = []

    def told(consumer: SearcherConsumer) -> None:
        strategy = consumer.searches[1].method.strategy
        assert isinstance(strategy, TPEStrategy)
        told_at_restart.append(len(strategy.told))

    results = []
    for restarts in (set(), {5, 40, 60, 75}):
        store = await _fresh_store(pg_server, f"tpe_{len(results)}_{abs(hash(db_url)) % 10_000}")
        results.append(
            await simulate(
                store, restarts, config=TPE_CONFIG, on_rebuild=told if restarts else None
            )
        )
        assert await check_log(store) == []
        await store.close()
    assert told_at_restart[0] < 3 <= told_at_restart[-1], (
        f"restarts hit both the startup and the TPE phase: {told_at_restart}"
    )
    straight, restarted = results
    assert [d for d in restarted if d[0] == "TrialRequested"] == [
        d for d in straight if d[0] == "TrialRequested"
    ]
    assert restarted == straight
    requested = [d for d in straight if d[0] == "TrialRequested"]
    assert len(requested) == 10 and len({d[1] for d in requested}) == 10
    assert straight[-1][0] == "ExperimentStateChanged" and straight[-1][4] == "STOPPING_COMPLETED"


async def test_replay_that_chooses_other_hparams_than_recorded_is_reported(
    store: EventStore,
) -> None:
    """A recorded TrialRequested whose hparams the replayed method does not choose again (as after
    a sampler upgrade under a running search) is logged as a divergence; the recorded trial stands."""
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=TPE_CONFIG)])
    runner = ConsumerRunner(store, None, SearcherConsumer(store))
    await runner.catch_up()
    first = next(e for e in await store.read_all() if e.type == "TrialRequested")
    forged = {**first.payload["hparams"], "hidden": first.payload["hparams"]["hidden"] + 1}
    await store.append(
        "experiment-2",
        [ExperimentSubmitted(experiment_id=2, config=TPE_CONFIG)],
    )
    await store.append(
        "experiment-2",
        [
            TrialRequested(
                experiment_id=2,
                trial_id=99,
                seq=1,
                request_id=first.payload["request_id"],
                hparams=forged,
                trial_seed=first.payload["trial_seed"],
            )
        ],
    )
    async with store.transaction() as tx:
        await tx.set_checkpoint("searcher", await store.head())
    consumer = SearcherConsumer(store)
    with capture_logs() as logs:
        await consumer.rebuild()
    diverged = [e for e in logs if e["event"] == "replayed search diverges from the log"]
    assert [(e["experiment"], e["request"]) for e in diverged] == [(2, first.payload["request_id"])]
    assert diverged[0]["recorded"] == forged
    assert consumer.searches[2].trial_of[first.payload["request_id"]] == 99
