"""Deciders decide each thing once on a live cluster: a whole adaptive ASHA search, every service
a process, leaves a log with no decision twice and no slot held twice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import Cluster, experiment_state, wait_for
from tests.e2e.test_trials import SCRIPTED, scripted

TERMINAL = {"COMPLETED", "CANCELED", "ERROR"}


def asha(checkpoints: Path) -> dict[str, Any]:
    """Sixteen short scripted trials under adaptive ASHA, four at a time."""
    config = scripted(checkpoints, steps=32, report_every=4, checkpoint_every=0, sleep=0.02)
    config["searcher"] = {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "time_metric": "batches",
        "max_time": 32,
        "max_trials": 16,
        "max_concurrent_trials": 4,
        "divisor": 4,
    }
    return config


def searcher_repeats(events: list[Any]) -> list[str]:
    """Searcher decisions that repeat an earlier one: a request id or a trial's stop twice
    (what :func:`events.domain.check.check_log` does not look at)."""
    requested = Counter(e.payload["request_id"] for e in events if e.type == "TrialRequested")
    stopped = Counter(e.payload["trial_id"] for e in events if e.type == "TrialStopRequested")
    return [f"request {r} requested {n} times" for r, n in requested.items() if n > 1] + [
        f"trial {t} stopped {n} times" for t, n in stopped.items() if n > 1
    ]


@pytest.mark.timeout(150)
async def test_asha_search_decides_everything_once(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """A 16-trial adaptive ASHA search runs to completion with every allocation, stop and trial
    outcome in the log exactly once, and no slot held by two allocations at a time."""
    exp = await cluster.submit(asha(tmp_path / "ckpt"), SCRIPTED)

    async def finished() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, finished, timeout=120)
    events = await store.read_all(limit=1_000_000)
    trials = {e.payload["trial_id"] for e in events if e.type == "TrialRequested"}
    closed = [e for e in events if e.type == "TrialStateChanged" and e.payload["state"] in TERMINAL]
    assert len(trials) == 16 and {e.payload["trial_id"] for e in closed} == trials
    assert any(e.type == "TrialStopRequested" for e in events), "ASHA stopped some trials early"
    assert [str(f) for f in await check_log(store)] == []
    assert searcher_repeats(events) == []
