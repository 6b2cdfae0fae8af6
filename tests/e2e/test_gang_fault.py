"""A rank of a two-agent gang SIGKILLed mid-run: the whole gang restarts from its checkpoint and
ends where a fault-free run with the same seed ends (the digits example with DDP, gloo on CPU,
two agents with one slot each). The longer two-agent runs are in ``test_distributed.py``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairn.local.servers import ServerProcess
from events.domain import names
from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import (
    GANG_AGENTS,
    Cluster,
    experiment_state,
    first_trial,
    gang_processes,
    rank_pid,
    wait_for,
)
from tests.helpers import ROOT, process_alive, wait_until

DIGITS = ROOT / "examples" / "digits"
MAX_BATCHES = 160
VALIDATE_EVERY = 20


@pytest.fixture
async def gang_cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Every service as a process and two agents with one CPU slot each."""
    async with gang_processes(db_url, nats_server.url, tmp_path, 1, 60) as c:
        yield c


def gang_config(tmp_path: Path) -> dict[str, Any]:
    """The distributed example on two slots, seeded, a checkpoint at each validation."""
    config = yaml.safe_load((DIGITS / "distributed.yaml").read_text())
    config["hyperparameters"].update(max_batches=MAX_BATCHES, validate_every=VALIDATE_EVERY)
    config["resources"] = {"slots_per_trial": 2}
    config["reproducibility"] = {"experiment_seed": 11}
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    return config


async def fault_free_validations(
    seed: int, hparams: dict[str, Any]
) -> dict[int, tuple[float, float]]:
    """The validations of the same run without faults (:mod:`tests.e2e.ddp_reference`)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.e2e.ddp_reference",
        str(seed),
        json.dumps(hparams),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, "the reference run failed"
    return {int(k): (v[0], v[1]) for k, v in json.loads(out).items()}


async def test_rank_sigkill_restarts_gang_from_checkpoint_to_fault_free_accuracy(
    gang_cluster: Cluster, store: EventStore
) -> None:
    """Rank 1 SIGKILLed after the first checkpoint fails run 1; run 2 starts on both agents
    from the latest checkpoint, every rank resumes at its batch, and the trial's validations
    (final accuracy included) equal a fault-free run's with the same seed."""
    cluster = gang_cluster
    exp = await cluster.submit(gang_config(cluster.workdir), DIGITS)
    trial = await first_trial(cluster, store, exp)
    stream = names.trial_stream(trial)
    [requested] = [
        e.payload for e in await store.read_stream(names.experiment_stream(exp))
        if e.type == "TrialRequested"
    ]  # fmt: skip
    reference = asyncio.create_task(
        fault_free_validations(requested["trial_seed"], requested["hparams"])
    )
    first = names.allocation_id(trial, 1)

    async def rank1_started() -> bool:
        return rank_pid(first, 1) is not None

    await wait_until(rank1_started, timeout=120, every=0.5, detail=cluster.logs)
    victim = rank_pid(first, 1)
    assert victim is not None

    # The kill follows the first complete checkpoint on disk (``metadata.json`` is written
    # last) within a few batches; its report reaches the log asynchronously, much later.
    async def checkpoint_on_disk() -> bool:
        return any((cluster.workdir / "ckpt").glob("*/metadata.json"))

    await wait_until(checkpoint_on_disk, timeout=120, every=0.02, detail=cluster.logs)
    os.kill(victim, signal.SIGKILL)
    await wait_until(lambda: not process_alive(victim), timeout=10)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=180)
    events = await store.read_stream(stream)
    exited = [e.payload for e in events if e.type == "TrialExited"]
    exits = [(p["run_id"], p["outcome"]) for p in exited]
    assert exits == [(1, "failed"), (2, "completed")], (
        f"the SIGKILL failed run 1 mid-run; exits: {exited}\n{cluster.logs()}"
    )
    allocated = [e.payload["placements"] for e in events if e.type == "SlotsAllocated"]
    assert [sorted(p) for p in allocated] == [list(GANG_AGENTS)] * 2, "one rank on each agent"
    [restarted] = [e.payload for e in events if e.type == "TrialRestarted"]
    saved = {
        e.payload["uuid"]: e.payload["steps_completed"]
        for e in events
        if e.type == "CheckpointSaved" and e.payload["run_id"] == 1
    }
    assert restarted["restarts"] == 1 and restarted["latest_checkpoint"] == list(saved)[-1]
    resumed_at = saved[restarted["latest_checkpoint"]]
    assert VALIDATE_EVERY <= resumed_at < MAX_BATCHES
    [started] = {
        e.payload["restored_checkpoint"]
        for e in events
        if e.type == "TrialStarted" and e.payload["run_id"] == 2
    }
    assert started == restarted["latest_checkpoint"]
    killed = await store.fetch("SELECT line FROM task_logs WHERE allocation_id = $1", first)
    assert any(f"Signal 9 (SIGKILL) received by PID {victim}" in r["line"] for r in killed)
    rows = await store.fetch(
        "SELECT line FROM task_logs WHERE allocation_id = $1", names.allocation_id(trial, 2)
    )
    lines = {r["line"] for r in rows}
    for rank in (0, 1):
        assert f"[rank={rank}] resumed from {started} at batch {resumed_at}" in lines

    validations = {
        (e.payload["run_id"], e.payload["steps_completed"]): e.payload["metrics"]
        for e in events
        if e.type == "ValidationReported"
    }
    assert min(s for r, s in validations if r == 2) > resumed_at, "run 2 did not start over"
    expected = await reference
    assert max(expected) == MAX_BATCHES
    for (_, steps), metrics in validations.items():
        loss, accuracy = expected[steps]
        assert metrics["validation_accuracy"] == pytest.approx(accuracy, abs=1e-6), steps
        assert metrics["validation_loss"] == pytest.approx(loss, rel=1e-5), steps
    assert (2, MAX_BATCHES) in validations
    assert await check_log(store) == []
