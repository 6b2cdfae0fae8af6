"""DDP ranks on two agent hosts: the rendezvous hands out an address the other host reaches."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from events.domain import names
from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import experiment_state, first_trial, rank_pid, wait_for
from tests.helpers import ROOT, wait_until
from tests.hosts.conftest import AGENT_HOSTS, StartHosts
from tests.hosts.netns import Network, namespace_pids
from tests.hosts.trials import DIGITS

MAX_BATCHES = 80
VALIDATE_EVERY = 20


async def reference_validations(seed: int, hparams: dict[str, Any]) -> dict[int, float]:
    """``{steps: validation_loss}`` of the same training in one process on this host
    (:mod:`tests.e2e.ddp_reference`: DDP's averaged gradient is the global batch's)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.e2e.ddp_reference", str(seed), json.dumps(hparams),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode == 0, "the reference run failed"
    return {int(k): v[0] for k, v in json.loads(out).items()}


@pytest.mark.timeout(600)
async def test_four_ranks_on_two_hosts_train_as_one_host_does(
    hosts: StartHosts, network: Network, store: EventStore, tmp_path: Path
) -> None:
    """slots_per_trial 4 on two 2-slot agent hosts (gloo): each host runs two ranks, the chief's
    address handed to the other host is its bridge address, and every validation loss equals
    the one-process run's with the same seed."""
    cluster = await hosts(slots=2)
    config = yaml.safe_load((DIGITS / "distributed.yaml").read_text())
    config["hyperparameters"].update(max_batches=MAX_BATCHES, validate_every=VALIDATE_EVERY)
    config["resources"] = {"slots_per_trial": 4}
    config["reproducibility"] = {"experiment_seed": 7}
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    exp = await cluster.submit(config, DIGITS)
    trial = await first_trial(cluster, store, exp)
    [requested] = [
        e.payload for e in await store.read_stream(names.experiment_stream(exp))
        if e.type == "TrialRequested"
    ]  # fmt: skip
    reference = asyncio.create_task(
        reference_validations(requested["trial_seed"], requested["hparams"])
    )
    allocation = names.allocation_id(trial, 1)

    def ranks_running() -> dict[int, int] | None:
        pids = {rank: rank_pid(allocation, rank) for rank in range(4)}
        return None if None in pids.values() else pids  # type: ignore[return-value]

    pids = await wait_until(ranks_running, timeout=180, every=0.1, detail=cluster.logs)
    per_host = {
        agent: sorted(
            r for r, pid in pids.items() if pid in namespace_pids(network.hosts[agent].netns)
        )
        for agent in AGENT_HOSTS
    }
    assert sorted(map(len, per_host.values())) == [2, 2], per_host

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=300)
    events = await store.read_stream(names.trial_stream(trial))
    [placed] = [e.payload["placements"] for e in events if e.type == "SlotsAllocated"]
    assert sorted(placed) == sorted(AGENT_HOSTS)
    assert all(len(slots) == 2 for slots in placed.values())
    lines = {
        r["line"]
        for r in await store.fetch(
            "SELECT line FROM task_logs WHERE allocation_id = $1", allocation
        )
    }
    for rank in range(4):
        assert f"[rank={rank}] training: first batch 1 done" in lines, rank
    chiefs = set()
    for agent in AGENT_HOSTS:
        log = (cluster.workdir / f"{agent}.log").read_text()
        chiefs |= set(re.findall(r'"chief": "([0-9.]+):\d+"', log))
    addresses = {network.hosts[agent].address for agent in AGENT_HOSTS}
    assert len(chiefs) == 1 and chiefs <= addresses, chiefs
    losses = {
        e.payload["steps_completed"]: e.payload["metrics"]["validation_loss"]
        for e in events
        if e.type == "ValidationReported"
    }
    expected = await reference
    assert (
        sorted(losses)
        == sorted(expected)
        == list(range(VALIDATE_EVERY, MAX_BATCHES + 1, VALIDATE_EVERY))
    )
    for steps, loss in losses.items():
        assert loss == pytest.approx(expected[steps], rel=1e-4), steps
    assert await check_log(store) == []
