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
from tests.helpers import ROOT, process_alive, run_pids, wait_until
from tests.hosts.conftest import AGENT_HOSTS, SPARE_HOST, StartHosts
from tests.hosts.netns import Network, namespace_pids
from tests.hosts.trials import DIGITS, explained, placements, run_output

MAX_BATCHES = 80
LONG_BATCHES = 200
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


async def reference_of(store: EventStore, experiment_id: int) -> dict[int, float]:
    """:func:`reference_validations` of the experiment's first trial's seed and hparams."""
    [requested] = [
        e.payload for e in await store.read_stream(names.experiment_stream(experiment_id))
        if e.type == "TrialRequested"
    ]  # fmt: skip
    return await reference_validations(requested["trial_seed"], requested["hparams"])


def four_ranks(tmp_path: Path, max_batches: int) -> dict[str, Any]:
    """The digits DDP example on 4 slots, seeded, a checkpoint at every validation."""
    config = yaml.safe_load((DIGITS / "distributed.yaml").read_text())
    config["hyperparameters"].update(max_batches=max_batches, validate_every=VALIDATE_EVERY)
    config["resources"] = {"slots_per_trial": 4}
    config["reproducibility"] = {"experiment_seed": 7}
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    return config


@pytest.mark.timeout(600)
async def test_four_ranks_on_two_hosts_train_as_one_host_does(
    hosts: StartHosts, network: Network, store: EventStore, tmp_path: Path
) -> None:
    """slots_per_trial 4 on two 2-slot agent hosts (gloo): each host runs two ranks, the chief's
    address handed to the other host is its bridge address, and every validation loss equals
    the one-process run's with the same seed."""
    cluster = await hosts(slots=2)
    exp = await cluster.submit(four_ranks(tmp_path, MAX_BATCHES), DIGITS)
    trial = await first_trial(cluster, store, exp)
    reference = asyncio.create_task(reference_of(store, exp))
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

    await explained(wait_for(cluster, completed, timeout=300), store, trial)
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


@pytest.mark.timeout(600)
async def test_gang_restarts_on_other_hosts_when_a_rank_host_is_cut_off(
    hosts: StartHosts, network: Network, store: EventStore, tmp_path: Path
) -> None:
    """Four ranks on two of three 2-slot agent hosts; after the first checkpoint one of the two
    hosts is cut off (its ranks alive, unable to reach their peers or the API): its agent is
    lost after the timeout, the run ends, and the gang restarts from the checkpoint on the two
    hosts left; it completes with the one-process run's validation losses, and once the link
    is back no process of the cut run is left."""
    cluster = await hosts(slots=2, agent_timeout=4.0, agents=(*AGENT_HOSTS, SPARE_HOST))
    exp = await cluster.submit(four_ranks(tmp_path, LONG_BATCHES), DIGITS)
    trial = await first_trial(cluster, store, exp)
    reference = asyncio.create_task(reference_of(store, exp))

    async def checkpointed() -> bool:
        stream = await store.read_stream(names.trial_stream(trial))
        return any(e.type == "CheckpointSaved" for e in stream)

    await wait_until(checkpointed, timeout=180, every=0.05, detail=cluster.logs)
    placed_so_far = await placements(store, trial)
    placed = placed_so_far[-1]
    current = names.allocation_id(trial, len(placed_so_far))
    victim = placed[0]
    cut_off = [p for p in run_pids(current) if p in namespace_pids(network.hosts[victim].netns)]
    assert cut_off, f"no process of {current} in {victim}\n{await run_output(store, trial)}"
    network.cut(victim)

    async def lost() -> bool:
        agent_events = await store.read_stream(names.agent_stream(victim))
        return "AgentLost" in [e.type for e in agent_events]

    await wait_for(cluster, lost, timeout=60)
    assert any(process_alive(p) for p in cut_off), "the cut-off ranks ran through the verdict"

    async def placed_elsewhere() -> bool:
        return any(victim not in p for p in await placements(store, trial))

    await wait_for(cluster, placed_elsewhere, timeout=90)
    network.restore(victim)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await explained(wait_for(cluster, completed, timeout=300), store, trial)
    await wait_for(cluster, lambda: not any(process_alive(p) for p in cut_off), timeout=60)
    events = await store.read_stream(names.trial_stream(trial))
    exits = [(e.payload["run_id"], e.payload["outcome"]) for e in events if e.type == "TrialExited"]
    # The cut run ends lost (the verdict on the silent agent) unless the surviving part's failure
    # is reported first; a restart placed on the cut-off agent before the verdict is lost too.
    # A run of a gang across these hosts also fails now and then without any fault (a rank
    # aborts in gloo: "terminate called without an active exception", about one run in ten
    # here; not understood yet), and is restarted like any failed run.
    output = await run_output(store, trial)
    assert all(o in {"lost", "failed"} for _, o in exits[:-1]), f"{exits}\n{output}"
    last_run, outcome = exits[-1]
    assert outcome == "completed", exits
    # Once the link is back the victim is a host like any other: a run that fails after the
    # restore (the gloo abort above) may be placed on it again. What the fault must produce is a
    # placement without it while it was cut off (waited on above) and a finished two-host gang.
    all_placements = await placements(store, trial)
    assert any(victim not in p and len(p) == 2 for p in all_placements), all_placements
    assert len(all_placements[-1]) == 2, all_placements
    [resumed] = [
        e.payload["restored_checkpoint"]
        for e in events
        if e.type == "TrialStarted" and e.payload["run_id"] == last_run
    ]
    assert resumed is not None, "the gang restarted from its checkpoint"
    losses = {
        (e.payload["run_id"], e.payload["steps_completed"]): e.payload["metrics"]["validation_loss"]
        for e in events
        if e.type == "ValidationReported"
    }
    expected = await reference
    assert (last_run, LONG_BATCHES) in losses
    for (_, steps), loss in losses.items():
        assert loss == pytest.approx(expected[steps], rel=1e-4), steps
    assert await check_log(store) == []
