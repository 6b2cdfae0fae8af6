"""A DeepSpeed trial through Determined's launcher name: ``python3 -m
determined.launch.deepspeed python3 train.py`` on two CPU slots of one agent
(``examples/deepspeed``). DeepSpeed is an opt-in extra and its first run compiles an op, so
``make test-deepspeed`` installs it and runs this (``CAIRN_TEST_DEEPSPEED=1``); ``make test``
skips it."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from cairn.local.servers import ServerProcess
from events.domain.names import trial_stream
from events.log.store import EventStore
from tests.e2e.harness import Cluster, experiment_state, trial_ids, wait_for
from tests.helpers import ROOT

EXAMPLE = ROOT / "examples" / "deepspeed"

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("CAIRN_TEST_DEEPSPEED") != "1"
        or importlib.util.find_spec("deepspeed") is None,
        reason="DeepSpeed is an opt-in extra: `make test-deepspeed` installs it and runs this",
    ),
    pytest.mark.timeout(600),
]


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Every service and one agent with two CPU slots."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_services("--agent-timeout", "15", timeout=30)
    c.start_agent("agent-a", 2, "--checkpoint-root", str(tmp_path / "storage"))
    try:
        await c.login()
        yield c
    finally:
        c.stop()


async def test_deepspeed_trial_runs_two_workers_through_determineds_launcher(
    cluster: Cluster, store: EventStore
) -> None:
    """The trial completes; both workers started (their lines prefixed with their ranks), the
    chief alone reported the averaged loss and saved the checkpoint."""
    config = yaml.safe_load((EXAMPLE / "config.yaml").read_text())
    exp = await cluster.submit(config, EXAMPLE)

    async def ended() -> bool:
        return await experiment_state(store, exp) in ("COMPLETED", "ERROR", "CANCELED")

    await wait_for(cluster, ended, timeout=540)
    (trial,) = await trial_ids(store, exp)
    body = await cluster.request("GET", f"/trials/{trial}/logs?limit=5000")
    lines = [entry["line"] for entry in body["logs"]]
    state = await experiment_state(store, exp)
    assert state == "COMPLETED", "\n".join(lines[-80:])
    assert any(line.startswith("[rank=0] ") and "worker 0 of 2" in line for line in lines)
    assert any(line.startswith("[rank=1] ") and "worker 1 of 2" in line for line in lines)
    events = await store.read_stream(trial_stream(trial))
    steps = [e.payload["steps_completed"] for e in events if e.type == "WorkloadCompleted"]
    saved = [e.payload for e in events if e.type == "CheckpointSaved"]
    assert steps == [4, 8] and [c["steps_completed"] for c in saved] == [8]
