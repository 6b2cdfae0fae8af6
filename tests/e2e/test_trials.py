"""Trials run end to end as real processes: scheduler, agent, API, Core API, restarts, signals."""

from __future__ import annotations

import copy
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairn.local.servers import ServerProcess
from events.domain.names import trial_stream
from events.log.store import EventStore
from tests.e2e.harness import Cluster, events_of, experiment_state, first_trial, trial_ids, wait_for
from tests.helpers import ROOT

SCRIPTED = ROOT / "examples" / "scripted"
CORE_API = ROOT / "examples" / "core_api"


def scripted(checkpoints: Path, **hparams: Any) -> dict[str, Any]:
    config = yaml.safe_load((SCRIPTED / "config.yaml").read_text())
    config = copy.deepcopy(config)
    config["hyperparameters"].update(hparams)
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(checkpoints)}
    config["reproducibility"] = {"experiment_seed": 7}
    return config


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Relay, searcher, scheduler, API and one 2-slot agent, as processes."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=2, agent_timeout=3.0)
    try:
        await c.login()
        yield c
    finally:
        c.stop()


async def trial_events(store: EventStore, trial_id: int) -> list[Any]:
    return await store.read_stream(trial_stream(trial_id))


async def test_trial_runs_reports_and_completes(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """A submitted experiment's trial is scheduled, runs as a process, reports metrics and checkpoints, completes;
    every event of the run names its actor (the user, a service, the agent or the trial)."""
    exp = await cluster.submit(scripted(tmp_path / "ckpt", steps=40, sleep=0.01), SCRIPTED)
    trial = await first_trial(cluster, store, exp)
    await wait_for(cluster, lambda: _is(store, exp, "COMPLETED"))
    types = [e.type for e in await trial_events(store, trial)]
    for expected in (
        "SlotsAllocated",
        "TrialStarted",
        "WorkloadCompleted",
        "ValidationReported",
        "CheckpointSaved",
        "TrialExited",
    ):
        assert expected in types
    exited = [e for e in await trial_events(store, trial) if e.type == "TrialExited"]
    assert exited[-1].payload["outcome"] == "completed"
    everything = await store.read_all(0, limit=100_000)
    assert [e.type for e in everything if not e.metadata.actor] == []
    actors = {e.type: e.metadata.actor for e in everything}
    assert actors["ExperimentSubmitted"] == "admin"
    assert actors["TrialRequested"] == "service:searcher"
    assert actors["SlotsAllocated"] == "service:scheduler"
    assert actors["ValidationReported"] == f"trial:{trial}"
    assert all(e.metadata.request_id for e in everything if e.type == "ValidationReported")


async def test_crash_restarts_from_checkpoint(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """A run that exits non-zero restarts with a new run id from its latest checkpoint, not from zero."""
    config = scripted(tmp_path / "ckpt", steps=60, sleep=0.01, checkpoint_every=20, fail_at_step=45)
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)
    await wait_for(cluster, lambda: _is(store, exp, "COMPLETED"))
    events = await trial_events(store, trial)
    exits = [e.payload for e in events if e.type == "TrialExited"]
    assert [(x["run_id"], x["outcome"], x["exit_code"]) for x in exits] == [
        (1, "failed", 3),
        (2, "completed", 0),
    ]
    restarted = [e.payload for e in events if e.type == "TrialRestarted"]
    assert restarted and restarted[0]["latest_checkpoint"]
    second_run = [
        e.payload["steps_completed"]
        for e in events
        if e.type == "WorkloadCompleted" and e.payload["run_id"] == 2
    ]
    assert second_run and min(second_run) > 40, "the resumed run continued from steps_completed=40"
    started = [e.payload for e in events if e.type == "TrialStarted"]
    assert started[1]["restored_checkpoint"] == restarted[0]["latest_checkpoint"]


async def test_max_restarts_exhausted_errors_the_trial(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """A trial that always fails is ERROR after max_restarts, and so is its single-trial experiment."""
    config = scripted(tmp_path / "ckpt", steps=10, sleep=0.0, exit_code=5)
    config["max_restarts"] = 1
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)
    await wait_for(cluster, lambda: _is(store, exp, "ERROR"))
    exits = [e.payload for e in await trial_events(store, trial) if e.type == "TrialExited"]
    assert [x["outcome"] for x in exits] == ["failed", "failed"]


async def test_pause_and_activate_resume_from_checkpoint(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """Pausing preempts the running trial (it checkpoints and exits 0); activating resumes it from that checkpoint."""
    config = scripted(tmp_path / "ckpt", steps=300, sleep=0.02, checkpoint_every=1000)
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)

    async def reported() -> bool:
        return any(e.type == "WorkloadCompleted" for e in await trial_events(store, trial))

    await wait_for(cluster, reported)
    await cluster.action(exp, "pause")

    async def preempted() -> bool:
        return any(e.type == "TrialExited" for e in await trial_events(store, trial))

    await wait_for(cluster, preempted)
    exits = [e.payload for e in await trial_events(store, trial) if e.type == "TrialExited"]
    assert exits[0]["outcome"] == "preempted" and exits[0]["exit_code"] == 0
    saved = [e.payload for e in await trial_events(store, trial) if e.type == "CheckpointSaved"]
    assert saved, "the preempted trial checkpointed before exiting"
    await cluster.action(exp, "activate")
    await wait_for(cluster, lambda: _is(store, exp, "COMPLETED"), timeout=90)
    started = [e.payload for e in await trial_events(store, trial) if e.type == "TrialStarted"]
    assert len(started) == 2 and started[1]["restored_checkpoint"] == saved[0]["uuid"]


async def test_kill_cancels_experiment(cluster: Cluster, store: EventStore, tmp_path: Path) -> None:
    """Killing an experiment terminates its running trial and ends CANCELED."""
    exp = await cluster.submit(scripted(tmp_path / "ckpt", steps=10_000, sleep=0.05), SCRIPTED)
    trial = await first_trial(cluster, store, exp)

    async def started() -> bool:
        return any(e.type == "TrialStarted" for e in await trial_events(store, trial))

    await wait_for(cluster, started)
    await cluster.action(exp, "kill")
    await wait_for(cluster, lambda: _is(store, exp, "CANCELED"))
    exits = [e.payload for e in await trial_events(store, trial) if e.type == "TrialExited"]
    assert exits[-1]["outcome"] == "killed"


async def test_higher_priority_experiment_preempts(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """With both slots busy at priority 50, a priority-1 experiment preempts one trial and runs."""
    low = scripted(tmp_path / "ckpt", steps=10_000, sleep=0.05)
    low["searcher"] = {"name": "grid", "metric": "validation_loss", "max_concurrent_trials": 2}
    low["hyperparameters"]["report_every"] = {"type": "categorical", "vals": [5, 10]}
    low["resources"]["priority"] = 50
    low_id = await cluster.submit(low, SCRIPTED)

    async def both_started() -> bool:
        return len(await events_of(store, "TrialStarted")) >= 2

    await wait_for(cluster, both_started)
    high = scripted(tmp_path / "ckpt", steps=20, sleep=0.01)
    high["resources"]["priority"] = 1
    high_id = await cluster.submit(high, SCRIPTED)
    await wait_for(cluster, lambda: _is(store, high_id, "COMPLETED"), timeout=90)
    preempted = [e.payload for e in await events_of(store, "PreemptionRequested")]
    assert len(preempted) == 1 and preempted[0]["trial_id"] in await trial_ids(store, low_id)
    await cluster.action(low_id, "kill")


async def test_agent_killed_mid_trial_reschedules_elsewhere(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """SIGKILL the agent during a trial: the trial is lost, restarted on another agent from its checkpoint, and completes."""
    config = scripted(tmp_path / "ckpt", steps=120, sleep=0.03, checkpoint_every=20)
    exp = await cluster.submit(config, SCRIPTED)
    trial = await first_trial(cluster, store, exp)

    async def checkpointed() -> bool:
        return any(e.type == "CheckpointSaved" for e in await trial_events(store, trial))

    await wait_for(cluster, checkpointed)
    cluster.kill("agent-a")
    cluster.start_agent("agent-b", 1)
    await wait_for(cluster, lambda: _is(store, exp, "COMPLETED"), timeout=90)
    events = await trial_events(store, trial)
    assert [e.payload["outcome"] for e in events if e.type == "TrialExited"] == [
        "lost",
        "completed",
    ]
    allocations = [list(e.payload["placements"]) for e in events if e.type == "SlotsAllocated"]
    assert allocations == [["agent-a"], ["agent-b"]]
    assert [e.type for e in await store.read_stream("agent-agent-a")][-1] == "AgentLost"


async def test_determined_style_script_pauses_and_resumes(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """The ported Determined script, paused mid-training, checkpoints at should_preempt() and
    exits 0; activated, it resumes from that checkpoint (latest_checkpoint) and COMPLETES with
    every batch counted once."""
    config = yaml.safe_load((CORE_API / "config.yaml").read_text())
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    config["hyperparameters"].update({"increment_by": 3, "batches": 400, "sleep": 0.02})
    exp = await cluster.submit(config, CORE_API)
    trial = await first_trial(cluster, store, exp)

    async def reported() -> bool:
        return any(e.type == "WorkloadCompleted" for e in await trial_events(store, trial))

    await wait_for(cluster, reported)
    await cluster.action(exp, "pause")

    async def preempted() -> bool:
        return any(e.type == "TrialExited" for e in await trial_events(store, trial))

    await wait_for(cluster, preempted)
    events = await trial_events(store, trial)
    [exited] = [e.payload for e in events if e.type == "TrialExited"]
    assert (exited["outcome"], exited["exit_code"]) == ("preempted", 0)
    [paused_at] = [e.payload for e in events if e.type == "CheckpointSaved"]
    assert 0 < paused_at["steps_completed"] < 400, "paused mid-training"
    await cluster.action(exp, "activate")
    await wait_for(cluster, lambda: _is(store, exp, "COMPLETED"), timeout=90)
    events = await trial_events(store, trial)
    saved = [e.payload for e in events if e.type == "CheckpointSaved"]
    assert saved[-1]["metadata"]["resumed_from"] == paused_at["uuid"]
    final = [e.payload for e in events if e.type == "ValidationReported"][-1]
    assert (final["steps_completed"], final["metrics"]["x"]) == (400, 1200)


async def test_determined_style_script_runs_with_cluster_info_and_resumes(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """A Core API script ported by its import line alone (``import cairn as det``) runs to
    COMPLETED: det.get_cluster_info() gives each trial its real ids and hparams, a restarted run
    sees latest_checkpoint and resumes from it, and det.InvalidHP ends a trial early, exit 0."""
    config = yaml.safe_load((CORE_API / "config.yaml").read_text())
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    config["searcher"] = {"name": "grid", "metric": "x", "smaller_is_better": False}
    config["hyperparameters"].update(
        {"increment_by": {"type": "categorical", "vals": [2, 0]}, "batches": 40, "fail_after": 20}
    )
    exp = await cluster.submit(config, CORE_API)

    async def ended() -> bool:
        return await experiment_state(store, exp) in ("COMPLETED", "ERROR", "CANCELED")

    await wait_for(cluster, ended, timeout=90)
    if await experiment_state(store, exp) != "COMPLETED":
        first = await first_trial(cluster, store, exp)
        logs = await cluster.request("GET", f"/trials/{first}/logs")
        lines = "\n".join(entry["line"] for entry in logs["logs"])
        raise AssertionError(f"experiment {exp} did not complete; trial {first} logged:\n{lines}")
    requested = {
        e.payload["hparams"]["increment_by"]: e.payload
        for e in await events_of(store, "TrialRequested")
        if e.payload["experiment_id"] == exp
    }
    assert sorted(requested) == [0, 2]

    valid = requested[2]
    trial = valid["trial_id"]
    events = await trial_events(store, trial)
    exits = [e.payload for e in events if e.type == "TrialExited"]
    assert [(x["run_id"], x["outcome"], x["exit_code"]) for x in exits] == [
        (1, "failed", 3),
        (2, "completed", 0),
    ]
    saved = [e.payload for e in events if e.type == "CheckpointSaved"]
    assert [(c["run_id"], c["steps_completed"]) for c in saved] == [(1, 20), (2, 40)]
    first, second = (c["metadata"] for c in saved)
    for seen, run_id in ((first, 1), (second, 2)):
        assert (seen["trial_id"], seen["experiment_id"], seen["run_id"]) == (trial, exp, run_id)
        assert seen["hparams"] == valid["hparams"] and seen["user_data"] == {"dataset": "counter"}
    assert first["resumed_from"] is None
    assert second["resumed_from"] == saved[0]["uuid"]
    validations = [
        (e.payload["steps_completed"], e.payload["metrics"]["x"])
        for e in events
        if e.type == "ValidationReported" and e.payload["run_id"] == 2
    ]
    assert validations == [(30, 60.0), (40, 80.0)], "run 2 resumed at batch 20 with x=40"

    async def logged_in_log_format() -> bool:
        logs = await cluster.request("GET", f"/trials/{trial}/logs")
        pattern = re.compile(r"^INFO: \[\d+\] root: batch 40 x=80$")
        return any(pattern.match(entry["line"]) for entry in logs["logs"])

    await wait_for(cluster, logged_in_log_format)

    invalid = await trial_events(store, requested[0]["trial_id"])
    assert [e.payload["reason"] for e in invalid if e.type == "TrialEarlyExited"] == ["invalid_hp"]
    assert [e.payload["exit_code"] for e in invalid if e.type == "TrialExited"] == [0]
    assert not any(e.type == "ValidationReported" for e in invalid)


async def _is(store: EventStore, exp: int, state: str) -> bool:
    return await experiment_state(store, exp) == state
