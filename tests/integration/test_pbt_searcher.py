"""PBT in the searcher service over a real log: lineage recorded, replay never re-decides."""

from __future__ import annotations

import math
from typing import Any

from events.domain.check import check_log
from events.domain.names import trial_stream
from events.domain.types import (
    CheckpointSaved,
    ExperimentSubmitted,
    TrialStateChanged,
    ValidationReported,
)
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
from services.searcher.service import SearcherConsumer
from tests.integration.test_searcher_service import _fresh_store

PBT_CONFIG: dict[str, Any] = {
    "name": "pbt",
    "entrypoint": "python3 train.py",
    "hyperparameters": {
        "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
        "hidden": {"type": "int", "minval": 8, "maxval": 64},
    },
    "searcher": {
        "name": "pbt",
        "metric": "validation_loss",
        "population_size": 4,
        "num_rounds": 4,
        "length_per_round": {"batches": 8},
        "replace_function": {"truncate_fraction": 0.25},
        "explore_function": {"resample_probability": 0.25, "perturb_factor": 0.2},
    },
    "reproducibility": {"experiment_seed": 4321},
}
TOTAL = 32


def loss(hparams: dict[str, Any], batches: int) -> float:
    """A scripted learning curve: better with more batches and an lr near 1e-2."""
    return abs(math.log10(hparams["lr"]) + 2) + 10.0 / (batches + 1) + hparams["hidden"] / 1000


async def simulate(store: EventStore, restart_at: frozenset[int] = frozenset()) -> list[Any]:
    """Drives a PBT search with scripted trials (validate, then checkpoint, every 4 batches; a
    clone starts at its warm-start checkpoint's batches) and a fresh searcher at each round in
    ``restart_at``; returns every searcher decision with its lineage."""
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=PBT_CONFIG)])
    consumer = SearcherConsumer(store)
    runner = ConsumerRunner(store, None, consumer)
    progress: dict[int, int] = {}
    for round_no in range(300):
        if round_no in restart_at:
            consumer = SearcherConsumer(store)  # a fresh process: it knows only the log
            await consumer.rebuild()
            runner = ConsumerRunner(store, None, consumer)
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
            batches = progress.get(trial_id, req["warm_start_steps"])
            if trial_id in stopped or batches >= TOTAL:
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
                    ),
                    CheckpointSaved(
                        trial_id=trial_id,
                        run_id=1,
                        uuid=f"ckpt-{trial_id}-{batches}",
                        steps_completed=batches,
                    ),
                ],
            )
    else:
        raise AssertionError("experiment did not finish")
    keys = (
        "trial_id",
        "hparams",
        "trial_seed",
        "state",
        "parent_trial_id",
        "round",
        "change",
        "warm_start_checkpoint",
    )
    return [
        (e.type, *(e.payload.get(k) for k in keys))
        for e in await store.read_all(limit=100_000)
        if e.type in ("TrialRequested", "TrialStopRequested", "ExperimentStateChanged")
    ]


async def test_pbt_search_records_lineage_and_survives_restarts(
    db_url: str, pg_server: Any
) -> None:
    """A PBT search restarted (replayed from the log) in every round decides exactly what a
    fault-free one does: the same clones, parents, rounds, explored changes and warm-start
    checkpoints; each clone names its parent's checkpoint at the end of the previous round."""
    results = []
    for restarts in (frozenset(), frozenset({2, 5, 9, 14, 18, 23})):
        store = await _fresh_store(pg_server, f"pbt_{len(results)}_{abs(hash(db_url)) % 10_000}")
        results.append(await simulate(store, restarts))
        assert await check_log(store) == []
        requests = [e.payload["request_id"] for e in await store.read_all(types=["TrialRequested"])]
        assert len(requests) == len(set(requests)), "no request decided twice"
        await store.close()
    straight, restarted = results
    assert restarted == straight
    requested = [d for d in straight if d[0] == "TrialRequested"]
    clones = [d for d in requested if d[5] is not None]
    assert len(requested) == 4 + 3 and len(clones) == 3
    by_id = {d[1]: d for d in requested}
    for clone in clones:
        _, _trial_id, hparams, _, _, parent, round_no, change, warm = clone
        assert parent in by_id and round_no in (1, 2, 3)
        assert warm == f"ckpt-{parent}-{8 * round_no}"
        assert change and all(hparams[k] == v["to"] for k, v in change.items())
    assert straight[-1][0] == "ExperimentStateChanged" and straight[-1][4] == "STOPPING_COMPLETED"
