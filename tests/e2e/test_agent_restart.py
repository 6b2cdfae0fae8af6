"""A restarted agent never hangs its experiment: real processes, the agent SIGKILLed mid-trial."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cairn.local.servers import ServerProcess
from events.domain import names
from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import Cluster, events_of, experiment_state, first_trial, trial_ids, wait_for
from tests.e2e.test_cli import CONFIG, created_id, run_cli
from tests.e2e.test_trials import SCRIPTED, scripted
from tests.helpers import group_pids, process_alive, run_pids, wait_until, wait_until_sync

SILENCE_TIMEOUT = 600.0  # far beyond every wait below: only reconciliation can end these runs


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Relay, searcher, scheduler, API and one 2-slot agent, as processes; heartbeat silence is
    judged only after ten minutes."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=2, agent_timeout=SILENCE_TIMEOUT)
    try:
        await c.login()
        yield c
    finally:
        c.stop()


async def test_agent_sigkilled_and_restarted_loses_and_restarts_both_runs(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """SIGKILL the agent while two trials run and restart it with the same id and slots (as the
    cluster supervisor does): both runs are recorded lost within the wait (not by the silence
    timeout), restart from their checkpoints on the same agent, and the experiment COMPLETES."""
    config = scripted(tmp_path / "ckpt", steps=150, sleep=0.03, checkpoint_every=20)
    config["searcher"] = {"name": "grid", "metric": "validation_loss", "max_concurrent_trials": 2}
    config["hyperparameters"]["report_every"] = {"type": "categorical", "vals": [5, 10]}
    exp = await cluster.submit(config, SCRIPTED)

    async def both_requested() -> bool:
        return len(await trial_ids(store, exp)) == 2

    await wait_for(cluster, both_requested)
    trials = await trial_ids(store, exp)

    async def both_checkpointed() -> bool:
        saved = {e.payload["trial_id"] for e in await events_of(store, "CheckpointSaved")}
        return saved >= set(trials)

    await wait_for(cluster, both_checkpointed, timeout=90)
    victim = cluster.procs["agent-a"]
    cluster.kill("agent-a")
    assert victim.returncode == -9, "the agent process was SIGKILLed"
    cluster.start_agent("agent-a", 2)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=120)
    for trial in trials:
        events = await store.read_stream(names.trial_stream(trial))
        exits = [e.payload for e in events if e.type == "TrialExited"]
        outcomes = [(x["run_id"], x["outcome"]) for x in exits]
        # On failure, the exits' messages (and codes) say how each run really ended.
        assert outcomes == [(1, "lost"), (2, "completed")], exits
        assert exits[0]["message"] == "agent restarted"
        [restarted] = [e.payload for e in events if e.type == "TrialRestarted"]
        assert restarted["restarts"] == 0 and restarted["latest_checkpoint"]
        started = [e.payload for e in events if e.type == "TrialStarted"]
        assert [s["run_id"] for s in started] == [1, 2]
        assert started[1]["restored_checkpoint"] == restarted["latest_checkpoint"]
        assert started[0]["agent_incarnation"] != started[1]["agent_incarnation"]
    agent_stream = [e.type for e in await store.read_stream("agent-agent-a")]
    assert agent_stream == ["AgentRegistered", "AgentRegistered"], "no AgentLost: no timeout"
    assert await check_log(store) == []


async def first_allocation(store: EventStore, trial_id: int) -> str:
    """The allocation id of the trial's first run, as the scheduler recorded it."""
    events = await store.read_stream(names.trial_stream(trial_id))
    return str(next(e.payload["allocation_id"] for e in events if e.type == "SlotsAllocated"))


async def test_orphaned_run_of_a_sigkilled_agent_is_killed_before_the_restart_registers(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """SIGKILL the agent mid-trial: its run's process survives and keeps training (the fault);
    the restarted agent SIGKILLs that whole process group before it registers, so the restarted
    run never trains beside it, and the experiment COMPLETES with a clean log."""
    config = scripted(
        tmp_path / "ckpt",
        steps=400,
        sleep=0.05,
        report_every=5,
        checkpoint_every=20,
        ignore_preemption=True,  # so only the platform can stop the orphan early
    )
    # Output to a file, not to the agent's pipe: a trial that writes to the pipe of a dead agent
    # dies of BrokenPipeError at its next line; one that logs elsewhere trains on.
    config["entrypoint"] = ["sh", "-c", "exec python3 train.py > train.out 2>&1"]
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)

    async def checkpointed() -> bool:
        return any(
            e.type == "CheckpointSaved" for e in await store.read_stream(names.trial_stream(trial))
        )

    await wait_for(cluster, checkpointed, timeout=90)
    allocation = await first_allocation(store, trial)
    [pid] = run_pids(allocation)
    cluster.kill("agent-a")
    assert cluster.procs["agent-a"].returncode == -signal.SIGKILL
    assert process_alive(pid), "the run's process outlived its agent"
    reported = len(await events_of(store, "WorkloadCompleted"))

    async def still_training() -> bool:
        return len(await events_of(store, "WorkloadCompleted")) > reported

    await wait_for(cluster, still_training, timeout=30)
    assert group_pids(pid), "the orphan's process group still runs just before the restart"

    cluster.start_agent("agent-a", 2)

    async def registered_again() -> bool:
        return len(await store.read_stream("agent-agent-a")) == 2

    await wait_for(cluster, registered_again, timeout=60)
    assert group_pids(pid) == [], "the orphan's group was gone before the new process registered"
    assert not process_alive(pid)
    log = (tmp_path / "agent-a.log").read_text()
    assert "left by an earlier agent process" in log, "the restarted agent stopped it"
    await wait_until(lambda: not run_pids(allocation), timeout=10)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=120)
    events = await store.read_stream(names.trial_stream(trial))
    exits = [e.payload for e in events if e.type == "TrialExited"]
    assert [(x["run_id"], x["outcome"]) for x in exits] == [(1, "lost"), (2, "completed")]
    assert await check_log(store) == []


async def test_agent_sigterm_mid_run_is_not_the_trials_failure(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """SIGTERM the agent while a trial with ``max_restarts: 0`` runs (as ``cairn down`` does),
    then start it again: the run's exit (143, the agent's own stop) is recorded ``lost``, the
    restart does not count (``restarts`` stays 0) and waits for the new agent process (nothing
    is placed on the leaving one), and the experiment COMPLETES with two runs."""
    config = scripted(tmp_path / "ckpt", steps=300, sleep=0.03, report_every=5, checkpoint_every=20)
    config["max_restarts"] = 0
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)

    async def checkpointed() -> bool:
        return any(
            e.type == "CheckpointSaved" for e in await store.read_stream(names.trial_stream(trial))
        )

    await wait_for(cluster, checkpointed, timeout=90)
    agent = cluster.procs["agent-a"]
    agent.send_signal(signal.SIGTERM)
    await wait_until(lambda: agent.poll() is not None, timeout=60)
    assert agent.returncode == 0, cluster.logs()

    async def exited() -> bool:
        events = await store.read_stream(names.trial_stream(trial))
        return any(e.type == "TrialExited" for e in events)

    await wait_for(cluster, exited, timeout=30)
    cluster.start_agent("agent-a", 2)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=120)
    events = await store.read_stream(names.trial_stream(trial))
    exits = [e.payload for e in events if e.type == "TrialExited"]
    assert [(x["run_id"], x["outcome"], x["exit_code"]) for x in exits] == [
        (1, "lost", 128 + signal.SIGTERM),
        (2, "completed", 0),
    ], exits
    restarts = [e.payload["restarts"] for e in events if e.type == "TrialRestarted"]
    assert restarts == [0], restarts
    assert await check_log(store) == []


async def trial_stream(dsn: str, trial_id: int) -> list[Any]:
    """The trial's events, read straight from the embedded cluster's log."""
    store = await EventStore.connect(dsn)
    try:
        return list(await store.read_stream(names.trial_stream(trial_id)))
    finally:
        await store.close()


async def agent_events(dsn: str, agent_id: str) -> list[Any]:
    """The agent's events, read straight from the embedded cluster's log."""
    store = await EventStore.connect(dsn)
    try:
        return list(await store.read_stream(names.agent_stream(agent_id)))
    finally:
        await store.close()


async def requested_trials(dsn: str, experiment_id: int) -> list[int]:
    """The experiment's trial ids so far, read straight from the embedded cluster's log."""
    store = await EventStore.connect(dsn)
    try:
        return await trial_ids(store, experiment_id)
    finally:
        await store.close()


def test_down_then_up_mid_trial_completes_the_experiment() -> None:
    """``cairn down`` while a trial runs, then ``cairn up`` at once: the agent, stopped first,
    says it is leaving and reports its run's end to the API still up (``lost``, with its exit
    code); the scheduler restarts it but places the restart only on the new agent process, so
    the trial has two runs, lost then completed from the checkpoint, and the experiment
    COMPLETES."""
    scratch = Path(tempfile.mkdtemp(prefix="cairn-downup-"))
    home = scratch / "home"
    up = ["up", "--slots", "2", "--api-port", "0", "--stop-timeout", "3"]
    try:
        assert run_cli(*up, home=home, timeout=150).returncode == 0
        dsn = json.loads((home / "cluster.json").read_text())["dsn"]
        hp = ["steps=200", "report_every=5", "checkpoint_every=10", "sleep=0.05"]
        overrides = [a for h in hp for a in ("--config", f"hyperparameters.{h}")]
        created = run_cli("experiment", "create", str(CONFIG), str(SCRIPTED), *overrides, home=home)
        assert created.returncode == 0, created.stderr
        exp = int(created_id(created.stdout))
        assert wait_until_sync(lambda: asyncio.run(requested_trials(dsn, exp)), timeout=60)
        trial = asyncio.run(requested_trials(dsn, exp))[0]

        def checkpointed() -> bool:
            events = asyncio.run(trial_stream(dsn, trial))
            return any(e.type == "CheckpointSaved" for e in events)

        wait_until_sync(checkpointed, timeout=90, every=0.3)
        assert run_cli("down", home=home, timeout=90).returncode == 0
        assert run_cli(*up, home=home, timeout=150).returncode == 0
        dsn = json.loads((home / "cluster.json").read_text())["dsn"]  # ports may change

        def exited() -> list[dict[str, Any]]:
            events = asyncio.run(trial_stream(dsn, trial))
            return [e.payload for e in events if e.type == "TrialExited"]

        wait_until_sync(
            lambda: len(exited()) == 2, timeout=150, every=0.3, detail=lambda: str(exited())
        )
        first, second = exited()
        assert (first["run_id"], first["outcome"]) == (1, "lost"), first
        assert first["exit_code"] is not None, "the agent's report, not a verdict: " + str(first)
        assert (second["run_id"], second["outcome"]) == (2, "completed")
        events = asyncio.run(trial_stream(dsn, trial))
        agent_id = next(e.payload["agent_id"] for e in events if e.type == "TrialStarted")
        agent = asyncio.run(agent_events(dsn, agent_id))
        leaving = next(e.position for e in agent if e.type == "AgentLeaving")
        registrations = [e.position for e in agent if e.type == "AgentRegistered"]
        exit_at = next(e.position for e in events if e.type == "TrialExited")
        restart_at = next(e.position for e in events if e.type == "TrialRestarted")
        assert leaving < exit_at < restart_at < registrations[-1], "all before the next up"
        [restarted] = [e.payload for e in events if e.type == "TrialRestarted"]
        started = [e.payload for e in events if e.type == "TrialStarted"]
        assert restarted["latest_checkpoint"] and restarted["restarts"] == 0
        assert started[1]["restored_checkpoint"] == restarted["latest_checkpoint"]
        agent_log = (home / "logs" / "agent.log").read_text()
        assert agent_log.count('"registered"') >= 2, "a second incarnation registered"
    finally:
        run_cli("down", home=home, timeout=90)
        shutil.rmtree(scratch, ignore_errors=True)
