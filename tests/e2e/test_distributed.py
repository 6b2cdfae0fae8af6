"""DDP on the digits MLP across two agents (2 slots each, gloo on CPU) through the torchrun
launcher: a rank or an agent SIGKILLed mid-run makes the whole gang restart from its checkpoint
and complete; 4 ranks follow the loss curve of 1 rank.

About five minutes on 2 cores, so it runs under ``make test-dist`` (``CAIRN_TEST_DIST=1``), not
``make test``; the cheap parts of the same path (rendezvous, its timeout, a failing part stopping
the gang) are in ``tests/integration/test_agent_gang.py`` and ``test_api_rendezvous.py``, and a
rank SIGKILLed in a two-agent gang of one rank each (restart from the checkpoint to the fault-free
accuracy) in ``test_gang_fault.py``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from cairn.local.servers import ServerProcess
from events.domain import names
from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import (
    Cluster,
    events_of,
    experiment_state,
    first_trial,
    gang_processes,
    rank_pid,
    wait_for,
)
from tests.helpers import run_pids

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("CAIRN_TEST_DIST") != "1",
        reason="two-agent DDP run takes minutes: `make test-dist` runs it",
    ),
    pytest.mark.timeout(600),
]

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Every service as a process and two agents with two CPU slots each."""
    async with gang_processes(db_url, nats_server.url, tmp_path, 2, 120) as c:
        yield c


async def submit_until_checkpointed(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> tuple[int, int]:
    """Submits the distributed example (160 batches) and waits for its first checkpoint;
    returns the experiment and trial ids."""
    config = yaml.safe_load((DIGITS / "distributed.yaml").read_text())
    config["hyperparameters"].update(max_batches=160, validate_every=40)
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    exp = await cluster.submit(config, DIGITS)
    trial = await first_trial(cluster, store, exp)
    stream = names.trial_stream(trial)

    async def checkpointed() -> bool:
        return any(e.type == "CheckpointSaved" for e in await store.read_stream(stream))

    await wait_for(cluster, checkpointed, timeout=240)
    return exp, trial


async def test_rank_sigkilled_gang_restarts_from_checkpoint_and_completes(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """slots_per_trial 4 spans both agents; after the first checkpoint rank 3 is SIGKILLed: the
    run fails, the whole gang restarts (restarts 1) from that checkpoint with a fresh
    rendezvous, and the trial completes with the accuracy of a healthy run."""
    exp, trial = await submit_until_checkpointed(cluster, store, tmp_path)
    stream = names.trial_stream(trial)
    first = names.allocation_id(trial, 1)
    victim = rank_pid(first, 3)
    assert victim is not None, "rank 3 of the first run is running"
    os.kill(victim, signal.SIGKILL)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=360)
    events = await store.read_stream(stream)
    allocated = [e.payload for e in events if e.type == "SlotsAllocated"]
    assert all(sorted(a["placements"]) == ["agent-a", "agent-b"] for a in allocated)
    exits = [(e.payload["run_id"], e.payload["outcome"]) for e in events if e.type == "TrialExited"]
    assert exits == [(1, "failed"), (2, "completed")], "the SIGKILL failed run 1"
    [restarted] = [e.payload for e in events if e.type == "TrialRestarted"]
    assert restarted["restarts"] == 1 and restarted["latest_checkpoint"]
    [started2] = [
        e.payload for e in events if e.type == "TrialStarted" and e.payload["run_id"] == 2
    ]
    assert started2["restored_checkpoint"] == restarted["latest_checkpoint"]
    joins = {
        (e.payload["allocation_id"], e.payload["agent_id"])
        for e in events
        if e.type == "RendezvousJoined"
    }
    second = names.allocation_id(trial, 2)
    assert {
        (first, "agent-a"),
        (first, "agent-b"),
        (second, "agent-a"),
        (second, "agent-b"),
    } <= joins
    validations = [e.payload for e in events if e.type == "ValidationReported"]
    assert validations[-1]["steps_completed"] == 160
    assert validations[-1]["metrics"]["validation_accuracy"] > 0.85
    rows = await store.fetch("SELECT line FROM task_logs WHERE allocation_id = $1", second)
    lines = [r["line"] for r in rows]
    assert any(line.startswith("[rank=3] ") for line in lines), "ranks are prefixed in the logs"
    assert any("resumed from" in line for line in lines)
    assert not await events_of(store, "AgentLost")
    assert await check_log(store) == []


async def test_four_ranks_follow_the_single_rank_loss_curve(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """The example with 4 ranks on two agents and with 1 rank (same seed and global batch, no
    dropout) reports the same training and validation losses at every validation, within 1e-3:
    DDP's averaged gradient is the global batch's."""
    curves: dict[int, list[tuple[int, float, float]]] = {}
    for slots in (4, 1):
        config = yaml.safe_load((DIGITS / "distributed.yaml").read_text())
        config["hyperparameters"].update(max_batches=100, validate_every=25)
        config["resources"] = {"slots_per_trial": slots}
        config["reproducibility"] = {"experiment_seed": 7}  # the same trial seed in both
        config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
        exp = await cluster.submit(config, DIGITS)
        trial = await first_trial(cluster, store, exp)

        async def completed(exp: int = exp) -> bool:
            return await experiment_state(store, exp) == "COMPLETED"

        await wait_for(cluster, completed, timeout=300)
        events = await store.read_stream(names.trial_stream(trial))
        [placed] = [e.payload["placements"] for e in events if e.type == "SlotsAllocated"]
        assert sum(len(s) for s in placed.values()) == slots
        training = {
            e.payload["steps_completed"]: e.payload["metrics"]["loss"]
            for e in events
            if e.type == "WorkloadCompleted"
        }
        curves[slots] = [
            (
                e.payload["steps_completed"],
                training[e.payload["steps_completed"]],
                e.payload["metrics"]["validation_loss"],
            )
            for e in events
            if e.type == "ValidationReported"
        ]
    assert [s for s, _, _ in curves[4]] == [25, 50, 75, 100] == [s for s, _, _ in curves[1]]
    for (_, train4, val4), (_, train1, val1) in zip(curves[4], curves[1], strict=True):
        assert train4 == pytest.approx(train1, rel=1e-3, abs=1e-4)
        assert val4 == pytest.approx(val1, rel=1e-3, abs=1e-4)


async def test_agent_sigkilled_gang_restarts_and_completes(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """After the first checkpoint agent-b is SIGKILLed and started again (as the supervisor
    does): the run is recorded lost, agent-a stops its part, and the whole gang restarts on both
    agents from the checkpoint (a lost run does not count against max_restarts) and completes."""
    exp, trial = await submit_until_checkpointed(cluster, store, tmp_path)
    stream = names.trial_stream(trial)
    first = names.allocation_id(trial, 1)
    victim = cluster.procs["agent-b"]
    cluster.kill("agent-b")
    assert victim.returncode == -9, "the agent process was SIGKILLed"
    cluster.start_agent("agent-b", 2, "--rendezvous-timeout", "120")

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=360)
    events = await store.read_stream(stream)
    exits = [(e.payload["run_id"], e.payload["outcome"]) for e in events if e.type == "TrialExited"]
    assert exits == [(1, "lost"), (2, "completed")]
    [restarted] = [e.payload for e in events if e.type == "TrialRestarted"]
    assert restarted["restarts"] == 0 and restarted["latest_checkpoint"]
    allocated = [e.payload for e in events if e.type == "SlotsAllocated"]
    assert all(sorted(a["placements"]) == ["agent-a", "agent-b"] for a in allocated)
    assert not run_pids(first), "no process of the lost run is left"
    assert await check_log(store) == []
