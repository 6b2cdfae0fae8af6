"""Network faults on an agent host's link: cut and restored, and random packet loss."""

from __future__ import annotations

import json
from pathlib import Path

from events.domain import names
from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import experiment_state, first_trial, wait_for
from tests.helpers import process_alive, run_pids, wait_until
from tests.hosts.conftest import AGENT_HOSTS, StartHosts
from tests.hosts.netns import Network
from tests.hosts.trials import SCRIPTED, placements, scripted

AGENT_TIMEOUT = 4.0
"""The scheduler's agent timeout in these tests (15 s by default), in seconds."""
EXIT_RUN_GONE = 75
"""The exit status of a trial process whose reports are refused (cairn.core._run_gone)."""


def run_exits(agent_log: Path, allocation_id: str) -> list[int]:
    """The exit codes the agent logged for ``allocation_id``'s processes."""
    exits = []
    for line in agent_log.read_text().splitlines():
        entry = json.loads(line) if line.startswith("{") else {}
        if entry.get("event") == "run exited" and entry.get("allocation_id") == allocation_id:
            exits.append(int(entry["exit_code"]))
    return exits


async def test_cut_agent_host_is_lost_its_trial_restarts_elsewhere_and_the_old_run_stops(
    hosts: StartHosts, network: Network, store: EventStore, tmp_path: Path
) -> None:
    """The link of the host running a trial goes down after a checkpoint: the trial process
    keeps running but reaches nothing; the scheduler records the agent lost after its timeout
    and the trial restarts on the other host from that checkpoint; once the link is back the
    old process's reports are refused and it stops itself (exit 75); the trial completes and
    the log is consistent."""
    cluster = await hosts(slots=1, agent_timeout=AGENT_TIMEOUT)
    config = scripted(tmp_path / "ckpt", steps=400, sleep=0.05, checkpoint_every=20)
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)
    stream = names.trial_stream(trial)

    async def checkpointed() -> bool:
        return any(e.type == "CheckpointSaved" for e in await store.read_stream(stream))

    await wait_for(cluster, checkpointed, timeout=90)
    [[victim]] = await placements(store, trial)
    [survivor] = [a for a in AGENT_HOSTS if a != victim]
    first = names.allocation_id(trial, 1)
    [old_pid] = run_pids(first)
    network.cut(victim)

    async def lost() -> bool:
        agent_events = await store.read_stream(names.agent_stream(victim))
        return any(e.type == "AgentLost" for e in agent_events)

    await wait_for(cluster, lost, timeout=60)
    assert process_alive(old_pid), "the cut-off trial process kept running"
    assert cluster.procs[victim].poll() is None, "the cut-off agent kept running"

    async def restarted_elsewhere() -> bool:
        return await placements(store, trial) == [[victim], [survivor]]

    await wait_for(cluster, restarted_elsewhere, timeout=60)
    assert process_alive(old_pid), "the old run outlived the verdict while cut off"
    network.restore(victim)
    await wait_for(cluster, lambda: not process_alive(old_pid), timeout=60)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=120)
    events = await store.read_stream(stream)
    exits = [(e.payload["run_id"], e.payload["outcome"]) for e in events if e.type == "TrialExited"]
    assert exits == [(1, "lost"), (2, "completed")]
    [restarted] = [e.payload for e in events if e.type == "TrialRestarted"]
    saved = [e.payload["uuid"] for e in events if e.type == "CheckpointSaved"]
    assert restarted["latest_checkpoint"] in saved
    [resumed] = [
        e.payload["restored_checkpoint"]
        for e in events
        if e.type == "TrialStarted" and e.payload["run_id"] == 2
    ]
    assert resumed == restarted["latest_checkpoint"]
    await wait_for(cluster, lambda: run_exits(cluster.workdir / f"{victim}.log", first))
    assert run_exits(cluster.workdir / f"{victim}.log", first) == [EXIT_RUN_GONE]
    assert await check_log(store) == []


async def test_trial_completes_through_five_percent_packet_loss_on_its_host(
    hosts: StartHosts, network: Network, store: EventStore, tmp_path: Path
) -> None:
    """5% of the packets into and out of the trial's agent host are dropped at random (iptables
    ``statistic`` in its namespace) from the start of the run: the trial still completes in
    one run, and the rules did drop packets."""
    cluster = await hosts(slots=1)
    config = scripted(tmp_path / "ckpt", steps=200, sleep=0.05, checkpoint_every=50)
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)

    async def placed() -> list[list[str]]:
        return await placements(store, trial)

    [[host]] = await wait_until(placed, timeout=60, every=0.05, detail=cluster.logs)
    network.drop_at_random(host, 0.05)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=180)
    events = await store.read_stream(names.trial_stream(trial))
    assert [e.payload["outcome"] for e in events if e.type == "TrialExited"] == ["completed"]
    assert network.dropped(host) > 0, "no packet was dropped"
    assert await check_log(store) == []
