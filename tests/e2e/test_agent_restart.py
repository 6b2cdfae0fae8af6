"""A restarted agent never hangs its experiment: real processes, the agent SIGKILLed mid-trial."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairn.local.servers import ServerProcess
from events.store import EventStore
from tests.e2e.harness import Cluster, events_of, experiment_state, wait_for
from tests.e2e.test_trials import SCRIPTED, scripted

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
    trials = [f"{exp}.1", f"{exp}.2"]

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
        events = await store.read_stream(f"trial-{trial}")
        exits = [e.payload for e in events if e.type == "TrialExited"]
        assert [(x["run_id"], x["outcome"]) for x in exits] == [(1, "lost"), (2, "completed")]
        assert exits[0]["message"] == "agent restarted"
        [restarted] = [e.payload for e in events if e.type == "TrialRestarted"]
        assert restarted["restarts"] == 0 and restarted["latest_checkpoint"]
        started = [e.payload for e in events if e.type == "TrialStarted"]
        assert [s["run_id"] for s in started] == [1, 2]
        assert started[1]["restored_checkpoint"] == restarted["latest_checkpoint"]
        assert started[0]["agent_incarnation"] != started[1]["agent_incarnation"]
    agent_stream = [e.type for e in await store.read_stream("agent-agent-a")]
    assert agent_stream == ["AgentRegistered", "AgentRegistered"], "no AgentLost: no timeout"
