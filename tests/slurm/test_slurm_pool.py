"""Trials of a Slurm pool on a real single-machine Slurm: each run a batch job whose agent,
reserved for it, runs it; Slurm's cancellations, time limits and cairn's crashes leave cairn and
``squeue`` in agreement."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import events_of, experiment_state, first_trial, trial_ids, wait_for
from tests.hosts.trials import DIGITS, SCRIPTED, explained, scripted
from tests.slurm.cluster import SlurmCluster, slurm_jobs, trial_runs

pytestmark = pytest.mark.timeout(600)


def in_pool(config: dict[str, Any], pool: str = "hpc") -> dict[str, Any]:
    config = copy.deepcopy(config)
    config.setdefault("resources", {})["resource_pool"] = pool
    return config


async def completed(cluster: SlurmCluster, store: EventStore, exp: int, timeout: float) -> None:
    async def done() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, done, timeout=timeout)


async def agreed(cluster: SlurmCluster, store: EventStore) -> None:
    """Waits until every job cairn recorded has ended, in squeue as in the log, and no job of
    cairn's name is unknown to the log."""

    async def agree() -> bool:
        recorded = await slurm_jobs(store)
        queue = cluster.squeue()
        live = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED"}
        return (
            set(queue) <= set(recorded)
            and not any(state in live for _, state in queue.values())
            and all(
                j["state"] not in ("SUBMITTED", "PENDING", "RUNNING") for j in recorded.values()
            )
        )

    await wait_for(cluster, agree, timeout=90)


async def test_a_trial_runs_as_a_slurm_job_on_an_agent_reserved_for_it(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """A trial of pool hpc is one Slurm job; its run is placed on that job's agent, completes,
    and the job ends COMPLETED in squeue and in the log."""
    config = in_pool(scripted(tmp_path / "ckpt", steps=20, sleep=0.05))
    exp = await slurm_cluster.submit(config, SCRIPTED)
    trial = await first_trial(slurm_cluster, store, exp)
    await explained(completed(slurm_cluster, store, exp, timeout=120), store, trial)
    await agreed(slurm_cluster, store)
    [job] = (await slurm_jobs(store)).values()
    assert (job["allocation_id"], job["state"]) == (f"{trial}.1", "COMPLETED")
    [placed] = [r for r in await trial_runs(store, trial) if r["type"] == "SlotsAllocated"]
    assert list(placed["placements"]) == [f"slurm-{job['job_id']}-{slurm_cluster.bed.node}"]
    assert await check_log(store) == []


def digits_asha(tmp_path: Path) -> dict[str, Any]:
    """The digits adaptive ASHA example, cut to 4 trials of at most 200 batches."""
    config = yaml.safe_load((DIGITS / "adaptive.yaml").read_text())
    config["searcher"].update(max_trials=4, max_time=200, max_concurrent_trials=2)
    config["reproducibility"] = {"experiment_seed": 3}
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    return in_pool(config)


async def test_digits_asha_search_runs_every_trial_as_a_slurm_job(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """The digits ASHA search completes with every run of every trial a Slurm job of its own,
    and squeue agrees with the log at the end."""
    exp = await slurm_cluster.submit(digits_asha(tmp_path), DIGITS)
    await completed(slurm_cluster, store, exp, timeout=420)
    await agreed(slurm_cluster, store)
    trials = await trial_ids(store, exp)
    assert len(trials) == 4
    jobs = await slurm_jobs(store)
    runs = {j["allocation_id"] for j in jobs.values()}
    for trial in trials:
        allocated = [r for r in await trial_runs(store, trial) if r["type"] == "SlotsAllocated"]
        assert allocated, trial
        for run in allocated:
            assert run["allocation_id"] in runs
            [agent] = run["placements"]
            assert agent.startswith("slurm-"), agent
    assert await check_log(store) == []


async def test_two_rank_trial_runs_in_one_job_of_two_cpus(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """slots_per_trial 2 is one job of one node with 2 CPUs whose agent runs both ranks."""
    config = yaml.safe_load((DIGITS / "distributed.yaml").read_text())
    config["hyperparameters"].update(max_batches=100, validate_every=50)
    config["resources"] = {"slots_per_trial": 2}
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(tmp_path / "ckpt")}
    exp = await slurm_cluster.submit(in_pool(config), DIGITS)
    trial = await first_trial(slurm_cluster, store, exp)
    await explained(completed(slurm_cluster, store, exp, timeout=300), store, trial)
    await agreed(slurm_cluster, store)
    [job] = (await slurm_jobs(store)).values()
    assert (job["nodes"], job["slots_per_node"]) == (1, 2)
    assert await check_log(store) == []


async def checkpointed_run(cluster: SlurmCluster, store: EventStore, trial: int) -> dict[str, Any]:
    """Waits for the trial's first checkpoint; its running job."""

    async def saved() -> bool:
        stream = await store.read_stream(f"trial-{trial}")
        return any(e.type == "CheckpointSaved" for e in stream)

    await wait_for(cluster, saved, timeout=180)
    [job] = [j for j in (await slurm_jobs(store)).values() if j["trial_id"] == trial]
    return job


async def resumed(cluster: SlurmCluster, store: EventStore, exp: int, trial: int) -> list[str]:
    """Waits for the experiment to complete; the outcomes of the trial's runs, after asserting
    the last run started from a checkpoint."""
    await explained(completed(cluster, store, exp, timeout=360), store, trial)
    runs = await trial_runs(store, trial)
    started = [r for r in runs if r["type"] == "TrialStarted"]
    assert len(started) >= 2, runs
    assert started[-1]["restored_checkpoint"] is not None, "the new job resumed from a checkpoint"
    return [r["outcome"] for r in runs if r["type"] == "TrialExited"]


async def test_scancel_from_outside_ends_the_run_and_a_new_job_resumes_it(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """An admin's scancel of a running trial's job: the trial checkpoints on Slurm's SIGTERM,
    its run ends preempted, and a new job resumes it from the checkpoint to completion."""
    config = in_pool(scripted(tmp_path / "ckpt", steps=400, checkpoint_every=20, sleep=0.1))
    exp = await slurm_cluster.submit(config, SCRIPTED)
    trial = await first_trial(slurm_cluster, store, exp)
    job = await checkpointed_run(slurm_cluster, store, trial)
    assert slurm_cluster.bed is not None
    slurm_cluster.bed.run("scancel", job["job_id"])
    outcomes = await resumed(slurm_cluster, store, exp, trial)
    assert outcomes[0] == "preempted" and outcomes[-1] == "completed", outcomes
    assert slurm_cluster.squeue()[job["job_id"]][1] == "CANCELLED"
    await agreed(slurm_cluster, store)
    assert await check_log(store) == []


async def test_time_limit_ends_the_run_and_a_new_job_resumes_it(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """A job of pool hpc-short (1 minute) reaches its time limit: the trial checkpoints on
    Slurm's SIGTERM, and a new job resumes it from the checkpoint to completion."""
    config = scripted(tmp_path / "ckpt", steps=1300, checkpoint_every=50, sleep=0.1)
    exp = await slurm_cluster.submit(in_pool(config, "hpc-short"), SCRIPTED)
    trial = await first_trial(slurm_cluster, store, exp)
    job = await checkpointed_run(slurm_cluster, store, trial)
    outcomes = await resumed(slurm_cluster, store, exp, trial)
    assert outcomes[-1] == "completed", outcomes
    assert slurm_cluster.squeue()[job["job_id"]][1] == "TIMEOUT"
    await agreed(slurm_cluster, store)
    assert await check_log(store) == []


async def test_scheduler_sigkilled_while_jobs_pend_leaves_no_job_twice_or_unknown(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """With the node full (a job of someone else's holds all its CPUs), a search's jobs pend
    with Slurm's reason, recorded; the scheduler is SIGKILLed and restarted; once the node is
    free every trial completes with exactly one job per run, and squeue agrees with the log."""
    bed = slurm_cluster.bed
    assert bed is not None
    blocker = bed.sbatch("--cpus-per-task=8", "--wrap", "sleep 600")
    bed.wait_state(blocker, "RUNNING", timeout=60)
    config = in_pool(scripted(tmp_path / "ckpt", steps=20, sleep=0.05))
    config["searcher"] = {
        "name": "grid", "metric": "validation_loss", "smaller_is_better": True,
        "max_concurrent_trials": 3,
    }  # fmt: skip
    config["hyperparameters"]["validation_offset"] = {"type": "categorical", "vals": [0, 1, 2]}
    exp = await slurm_cluster.submit(config, SCRIPTED)

    async def pending_recorded() -> bool:
        jobs = (await slurm_jobs(store)).values()
        return len(jobs) == 3 and all(j["state"] == "PENDING" for j in jobs)

    await wait_for(slurm_cluster, pending_recorded, timeout=60)
    reasons = {
        e.payload["reason"]
        for e in await events_of(store, "SlurmJobObserved")
        if e.payload["state"] == "PENDING"
    }
    assert reasons & {"Resources", "Priority"}, reasons
    queue = (await slurm_cluster.request("GET", "/job-queues"))["jobs"]
    assert [j["slurm"]["state"] for j in queue] == ["PENDING"] * 3, queue
    slurm_cluster.kill("scheduler")
    assert slurm_cluster.procs["scheduler"].poll() is not None, "the scheduler was SIGKILLed"
    slurm_cluster.start("scheduler", "services.scheduler", "--agent-timeout", "15")
    bed.run("scancel", blocker)
    await completed(slurm_cluster, store, exp, timeout=240)
    await agreed(slurm_cluster, store)
    jobs = await slurm_jobs(store)
    per_run = [j["allocation_id"] for j in jobs.values()]
    assert len(per_run) == len(set(per_run)) == 3, jobs
    assert await check_log(store) == []


async def test_scheduler_sigkilled_between_sbatch_and_its_record_adopts_the_job(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """The scheduler is SIGKILLed after sbatch returned and before the job was recorded: the
    next scheduler finds the job by its name in squeue and adopts it, so the run has exactly
    that one job, and it completes."""
    slurm_cluster.kill("scheduler")
    fault = {"CAIRN_FAULTS": "scheduler.slurm.after_sbatch=300"}
    slurm_cluster.start("scheduler", "services.scheduler", "--agent-timeout", "15", extra_env=fault)
    exp = await slurm_cluster.submit(in_pool(scripted(tmp_path / "ckpt", steps=20)), SCRIPTED)
    trial = await first_trial(slurm_cluster, store, exp)
    log = slurm_cluster.workdir / "scheduler.log"

    async def paused() -> bool:
        return "FAULT-POINT scheduler.slurm.after_sbatch" in log.read_text(errors="replace")

    await wait_for(slurm_cluster, paused, timeout=60)
    [submitted] = slurm_cluster.squeue()
    assert await slurm_jobs(store) == {}, "the job is not recorded yet"
    slurm_cluster.kill("scheduler")
    assert slurm_cluster.procs["scheduler"].poll() is not None, "the scheduler was SIGKILLed"
    slurm_cluster.start("scheduler", "services.scheduler", "--agent-timeout", "15")
    await explained(completed(slurm_cluster, store, exp, timeout=120), store, trial)
    await agreed(slurm_cluster, store)
    [job] = (await slurm_jobs(store)).values()
    assert (job["job_id"], job["adopted"], job["state"]) == (submitted, True, "COMPLETED")
    assert await check_log(store) == []


async def test_agent_sigkilled_in_its_job_ends_the_run_lost_and_a_new_job_resumes_it(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """SIGKILL of a job's agent: the job ends, the run ends lost (no restart counted), and a new
    job resumes the trial from its checkpoint to completion."""
    config = in_pool(scripted(tmp_path / "ckpt", steps=300, checkpoint_every=20, sleep=0.1))
    exp = await slurm_cluster.submit(config, SCRIPTED)
    trial = await first_trial(slurm_cluster, store, exp)
    job = await checkpointed_run(slurm_cluster, store, trial)
    agent = [
        p
        for p in psutil.process_iter(["cmdline"])
        if f"slurm-{job['job_id']}-" in " ".join(p.info["cmdline"] or [])
        and "services.agent" in " ".join(p.info["cmdline"] or [])
    ]
    assert len(agent) == 1, agent
    agent[0].kill()
    agent[0].wait(10)
    assert not agent[0].is_running(), "the agent was SIGKILLed"
    outcomes = await resumed(slurm_cluster, store, exp, trial)
    assert outcomes == ["lost", "completed"], outcomes
    await agreed(slurm_cluster, store)
    assert await check_log(store) == []


async def test_a_command_of_a_slurm_pool_runs_as_a_job(
    slurm_cluster: SlurmCluster, store: EventStore
) -> None:
    """A command task in pool hpc is one Slurm job whose agent runs it to completion."""
    answer = await slurm_cluster.request(
        "POST",
        "/commands",
        {"argv": ["python3", "-c", "print('hello from slurm')"],
         "config": {"resources": {"resource_pool": "hpc"}}},
    )  # fmt: skip
    task_id = str(answer["id"])

    async def exited() -> list[dict[str, Any]]:
        stream = await store.read_stream(f"task-{task_id}")
        return [e.payload for e in stream if e.type == "TaskExited"]

    await wait_for(slurm_cluster, exited, timeout=120)
    [end] = await exited()
    assert end["outcome"] == "completed", end
    await agreed(slurm_cluster, store)
    [job] = (await slurm_jobs(store)).values()
    assert (job["task_id"], job["state"]) == (task_id, "COMPLETED")
    assert await check_log(store) == []


async def test_a_trial_killed_while_its_job_pends_has_its_job_cancelled(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path
) -> None:
    """Killing a trial whose job still pends (the node is full) cancels the job: squeue shows
    it CANCELLED and the trial ends CANCELED without running."""
    bed = slurm_cluster.bed
    assert bed is not None
    blocker = bed.sbatch("--cpus-per-task=8", "--wrap", "sleep 600")
    bed.wait_state(blocker, "RUNNING", timeout=60)
    try:
        exp = await slurm_cluster.submit(in_pool(scripted(tmp_path / "ckpt")), SCRIPTED)
        trial = await first_trial(slurm_cluster, store, exp)

        async def pending() -> bool:
            return [j["state"] for j in (await slurm_jobs(store)).values()] == ["PENDING"]

        await wait_for(slurm_cluster, pending, timeout=60)
        await slurm_cluster.request("POST", f"/trials/{trial}/kill", {})
        await agreed(slurm_cluster, store)
        [job] = (await slurm_jobs(store)).values()
        assert job["state"] == "CANCELLED"
        runs = await trial_runs(store, trial)
        assert [r for r in runs if r["type"] == "SlotsAllocated"] == []
    finally:
        bed.run("scancel", blocker)
    assert await check_log(store) == []


@pytest.mark.parametrize("service", ["api", "relay", "searcher"])
async def test_a_service_sigkilled_while_a_job_runs_leaves_squeue_and_cairn_agreeing(
    slurm_cluster: SlurmCluster, store: EventStore, tmp_path: Path, service: str
) -> None:
    """SIGKILL of the API, the relay or the searcher while a trial runs in its Slurm job, then a
    restart: the run carries on (its agent retries what it reports), completes in that one job,
    and squeue agrees with the log."""
    config = in_pool(scripted(tmp_path / "ckpt", steps=120, checkpoint_every=20, sleep=0.1))
    exp = await slurm_cluster.submit(config, SCRIPTED)
    trial = await first_trial(slurm_cluster, store, exp)
    await checkpointed_run(slurm_cluster, store, trial)
    args = {"api": ("--host", slurm_cluster.api_host, "--port", str(slurm_cluster.api_port))}
    slurm_cluster.kill(service)
    assert slurm_cluster.procs[service].poll() is not None, f"the {service} was SIGKILLed"
    slurm_cluster.start(service, f"services.{service}", *args.get(service, ()))
    await explained(completed(slurm_cluster, store, exp, timeout=180), store, trial)
    await agreed(slurm_cluster, store)
    [job] = (await slurm_jobs(store)).values()
    assert job["state"] == "COMPLETED"
    assert [r["outcome"] for r in await trial_runs(store, trial) if r["type"] == "TrialExited"] == [
        "completed"
    ]
    assert await check_log(store) == []
