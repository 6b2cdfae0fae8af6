"""PBT on a live cluster: clones restore their parent's checkpoint, a searcher SIGKILL loses
nothing and decides nothing twice.

A cluster of processes costs ~30 s on two cores, beyond what ``make test`` can spare: this runs
under ``make test-search`` (``CAIRN_SEARCH_E2E=1``) and is skipped otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from events.domain.check import check_log
from events.domain.names import trial_stream
from events.log.store import EventStore
from tests.e2e.harness import Cluster, events_of, experiment_state, wait_for
from tests.e2e.test_decisions import searcher_repeats
from tests.e2e.test_trials import SCRIPTED, scripted

pytestmark = pytest.mark.skipif(
    not os.environ.get("CAIRN_SEARCH_E2E"), reason="a live-cluster search test: make test-search"
)


def pbt(checkpoints: Path) -> dict[str, Any]:
    """Four scripted trials of 30 steps, three rounds of 10; the loss offset is the hparam."""
    config = scripted(checkpoints, steps=30, report_every=10, checkpoint_every=10, sleep=0.1)
    config["hyperparameters"]["validation_offset"] = {
        "type": "double",
        "minval": 0.0,
        "maxval": 1.0,
    }
    config["searcher"] = {
        "name": "pbt",
        "metric": "validation_loss",
        "population_size": 4,
        "num_rounds": 3,
        "length_per_round": {"batches": 10},
        "replace_function": {"truncate_fraction": 0.25},
        "explore_function": {"resample_probability": 0.0, "perturb_factor": 0.2},
    }
    return config


@pytest.mark.timeout(180)
async def test_pbt_clones_warm_start_and_survive_a_searcher_kill(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """The searcher is SIGKILLed right after the first round's decision and restarted; the search
    completes with 4 + 2 trials, each decision once, and every clone's first run restores its
    parent's checkpoint (its first validation is one report past the warm-start steps)."""
    exp = await cluster.submit(pbt(tmp_path / "ckpt"), SCRIPTED)

    async def first_round_decided() -> bool:
        return bool(await events_of(store, "TrialStopRequested"))

    await wait_for(cluster, first_round_decided, timeout=90)
    cluster.kill("searcher")
    assert cluster.procs["searcher"].returncode == -9, "the searcher died of SIGKILL"
    cluster.start("searcher", "services.searcher")

    async def finished() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, finished, timeout=120)
    events = await store.read_all(limit=1_000_000)
    requested = [e.payload for e in events if e.type == "TrialRequested"]
    clones = [p for p in requested if p["parent_trial_id"] is not None]
    assert len(requested) == 6 and len(clones) == 2
    assert searcher_repeats(events) == []
    assert [str(f) for f in await check_log(store)] == []
    saved = {e.payload["uuid"]: e.payload for e in events if e.type == "CheckpointSaved"}
    for clone in clones:
        warm = saved[clone["warm_start_checkpoint"]]
        assert warm["trial_id"] == clone["parent_trial_id"]
        assert warm["steps_completed"] == clone["warm_start_steps"] == 10 * clone["round"]
        stream = await store.read_stream(trial_stream(clone["trial_id"]))
        started = next(e.payload for e in stream if e.type == "TrialStarted")
        assert started["restored_checkpoint"] == clone["warm_start_checkpoint"]
        first = next(e.payload for e in stream if e.type == "ValidationReported")
        assert first["steps_completed"] == clone["warm_start_steps"] + 10
    detail = await cluster.request("GET", f"/experiments/{exp}")
    assert [row["trial_id"] for row in detail["lineage"]] == [p["trial_id"] for p in clones]
