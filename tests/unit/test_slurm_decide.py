"""The Slurm bridge's decisions, as a pure function of the folded log and one squeue reading."""

from __future__ import annotations

from typing import Any

import pytest

from events.domain.aggregates.slurm import SlurmAllocations
from events.domain.config.cluster import parse_cluster_config
from events.domain.names import allocation_id, slurm_stream, trial_stream
from events.domain.types import (
    AgentRegistered,
    SlotsAllocated,
    SlurmJobObserved,
    SlurmJobSubmitted,
    TrialKillRequested,
)
from events.domain.types.agent import Slot
from events.log.envelope import Event, RecordedEvent
from services.scheduler.slurm.commands import Queue, QueuedJob, job_environment
from services.scheduler.slurm.decide import (
    Action,
    Adopt,
    Cancel,
    EndRun,
    GiveUp,
    Observe,
    Submit,
    decide,
)
from services.scheduler.slurm.requests import SlurmRequest
from services.scheduler.slurm.script import ShapeError, batch_script, job_name, shape
from tests.unit.test_planner import Log, experiment

POOL_DOC: dict[str, Any] = {
    "pool_name": "hpc",
    "resource_manager": "slurm",
    "slurm": {
        "partition": "debug",
        "slots_per_node": 2,
        "sbatch_args": ["--mem=1G"],
        "time_limit_minutes": 30,
        "api_url": "http://head:8080",
        "nats_url": "nats://head:4222",
        "join_token_file": "/etc/cairn/join-token",
        "work_root": "/shared/cairn",
        "max_submissions": 2,
    },
}
POOLS = parse_cluster_config({"resource_pools": [POOL_DOC]}).slurm_pools()
TRIAL = 11
ALLOC = allocation_id(TRIAL, 1)


class SlurmLog(Log):
    """The planner tests' log, also folding the Slurm allocations."""

    def __init__(self) -> None:
        super().__init__()
        self.slurm = SlurmAllocations()

    def add(self, stream: str, event: Event) -> RecordedEvent:
        recorded = super().add(stream, event)
        self.slurm.apply(recorded)
        return recorded

    def decide(self, queue: Queue, queue_from: int | None = None) -> list[Action]:
        at = self.position if queue_from is None else queue_from
        return decide(self.state, self.slurm, POOLS, "default", queue, at)

    def submitted(self, job_id: str = "100", submission: int = 1) -> None:
        self.add(
            slurm_stream(ALLOC),
            SlurmJobSubmitted(
                allocation_id=ALLOC, job_id=job_id, pool="hpc", trial_id=TRIAL, nodes=1,
                slots_per_node=1, submission=submission,
            ),
        )  # fmt: skip

    def observed(self, job_id: str, state: str, reason: str = "") -> None:
        self.add(
            slurm_stream(ALLOC),
            SlurmJobObserved(allocation_id=ALLOC, job_id=job_id, state=state, reason=reason),
        )


def queue(*jobs: tuple[str, str, str, str]) -> Queue:
    return Queue({j: QueuedJob(j, a, s, r) for j, a, s, r in jobs})


def slurm_log(trials: int = 1, pool: str = "hpc") -> SlurmLog:
    log = SlurmLog()
    experiment(log, 1, trials, resource_pool=pool)
    return log


def test_a_waiting_trial_of_a_slurm_pool_is_submitted_and_others_are_not() -> None:
    """Only trials of a Slurm pool become jobs, each its first submission."""
    assert slurm_log(pool="default").decide(queue()) == []
    [action] = slurm_log().decide(queue())
    assert isinstance(action, Submit)
    assert (action.request.allocation_id, action.submission) == (ALLOC, 1)


def test_a_recorded_job_is_not_submitted_again_and_its_changes_are_recorded_once() -> None:
    """A live job stops resubmission; squeue's pending reason is recorded when it changes."""
    log = slurm_log()
    log.submitted()
    pending = queue(("100", ALLOC, "PENDING", "Resources"))
    [action] = log.decide(pending)
    assert isinstance(action, Observe) and action.job.reason == "Resources"
    log.observed("100", "PENDING", "Resources")
    assert log.decide(pending) == []


def test_a_job_submitted_before_a_crash_is_adopted_not_doubled() -> None:
    """A job named for a waiting allocation that the log lacks is taken as its job."""
    [action] = slurm_log().decide(queue(("77", ALLOC, "PENDING", "Priority")))
    assert isinstance(action, Adopt) and action.job.job_id == "77"


def test_jobs_no_allocation_needs_are_cancelled() -> None:
    """An orphan of cairn's name and a job whose trial was killed while it waited are
    cancelled; an ended orphan is left alone."""
    log = slurm_log()
    log.submitted()
    orphans = queue(
        ("100", ALLOC, "PENDING", ""), ("5", "99.1", "RUNNING", ""), ("6", "98.1", "FAILED", "")
    )
    log.observed("100", "PENDING")
    assert log.decide(orphans) == [Cancel("99.1", "5", "no allocation of cairn's needs it")]
    log.add(trial_stream(TRIAL), TrialKillRequested(trial_id=TRIAL))
    cancels = [a for a in log.decide(orphans) if isinstance(a, Cancel)]
    assert [c.job_id for c in cancels] == ["100", "5"]


def test_a_job_that_ended_under_its_run_ends_the_run() -> None:
    """A time limit that killed the agents before they reported ends the run failed, so the
    restart rules apply."""
    log = slurm_log()
    log.submitted()
    log.observed("100", "RUNNING")
    log.add(
        trial_stream(TRIAL),
        SlotsAllocated(
            trial_id=TRIAL, allocation_id=ALLOC, placements={"slurm-100-n1": ["0"]}, run_id=1
        ),
    )
    actions = log.decide(queue(("100", ALLOC, "TIMEOUT", "TimeLimit")))
    assert [type(a) for a in actions] == [Observe, EndRun]
    end = actions[1]
    assert isinstance(end, EndRun) and (end.outcome, end.trial_id) == ("failed", TRIAL)


def test_a_job_gone_from_squeue_vanished_only_if_the_reading_is_newer() -> None:
    """A job missing from a reading begun after it was recorded vanished; from an older
    reading it is not judged."""
    log = slurm_log()
    log.submitted()
    assert log.decide(queue(), queue_from=log.position - 1) == []
    [action] = log.decide(queue())
    assert isinstance(action, Observe) and action.job.state == "VANISHED"


def test_an_allocation_whose_jobs_end_before_running_is_given_up() -> None:
    """Jobs that end before their run is placed are resubmitted up to max_submissions."""
    log = slurm_log()
    log.submitted("100")
    log.observed("100", "CANCELLED")
    [again] = log.decide(queue(("100", ALLOC, "CANCELLED", "")))
    assert isinstance(again, Submit) and again.submission == 2
    log.submitted("101", submission=2)
    log.observed("101", "NODE_FAIL")
    [given_up] = log.decide(queue())
    assert isinstance(given_up, GiveUp) and "101: NODE_FAIL" in given_up.reason


def test_batch_script_shapes_the_job_and_quotes_every_value() -> None:
    """Slots split over nodes of slots_per_node; pool and experiment options follow cairn's."""
    pool = POOLS["hpc"].slurm
    request = SlurmRequest(ALLOC, "hpc", slots=4, priority=42, trial_id=TRIAL,
                           sbatch_args=("--mem=2G",))  # fmt: skip
    assert (shape(request, pool).nodes, shape(request, pool).slots_per_node) == (2, 2)
    script = batch_script(request, pool, 1, "hpc")
    for line in (
        f"#SBATCH --job-name={job_name(ALLOC)}", "#SBATCH --nodes=2", "#SBATCH --cpus-per-task=2",
        "#SBATCH --partition=debug", "#SBATCH --time=30", "#SBATCH --nice=42",
        "#SBATCH --signal=USR2@60", "#SBATCH --no-requeue",
    ):  # fmt: skip
        assert line in script.splitlines()
    assert script.index("--mem=1G") < script.index("--mem=2G")
    assert "--reserved-for 11.1" in script and "--artificial-slots 2" in script
    with pytest.raises(ShapeError, match="do not split evenly"):
        shape(SlurmRequest(ALLOC, "hpc", slots=3, priority=1), pool)


def test_priority_bands_pick_the_qos_and_the_pool_qos_is_the_fallback() -> None:
    """priority_qos maps a job's priority to the first band at least as high; past every band
    the pool's qos applies."""
    pool = POOLS["hpc"].slurm.model_copy(
        update={
            "qos": "low",
            "priority_qos": parse_cluster_config(
                {
                    "resource_pools": [
                        {
                            **POOL_DOC,
                            "slurm": {
                                **POOL_DOC["slurm"],
                                "priority_qos": [
                                    {"max_priority": 60, "qos": "normal"},
                                    {"max_priority": 20, "qos": "high"},
                                ],
                            },
                        }
                    ]
                }
            )
            .slurm_pools()["hpc"]
            .slurm.priority_qos,
        }
    )
    assert [pool.qos_for(p) for p in (1, 20, 21, 60, 61)] == [
        "high", "high", "normal", "normal", "low",
    ]  # fmt: skip
    script = batch_script(SlurmRequest(ALLOC, "hpc", slots=1, priority=10), pool, 1, "hpc")
    assert "#SBATCH --qos=high" in script.splitlines()


def test_a_dead_agent_ends_its_run_lost_and_a_time_limit_failed() -> None:
    """A job FAILED under a running run is its agent's death (lost, no restart counted); a
    TIMEOUT the trial did not leave in time counts as a failure."""
    for state, outcome in (("FAILED", "lost"), ("TIMEOUT", "failed"), ("PREEMPTED", "preempted")):
        log = slurm_log()
        log.submitted()
        log.observed("100", "RUNNING")
        log.add(
            trial_stream(TRIAL),
            SlotsAllocated(trial_id=TRIAL, allocation_id=ALLOC, placements={"a": ["0"]}, run_id=1),
        )
        ends = [a for a in log.decide(queue(("100", ALLOC, state, ""))) if isinstance(a, EndRun)]
        assert [e.outcome for e in ends] == [outcome], state


def test_a_reserved_agent_gets_its_allocation_and_nothing_else() -> None:
    """An agent reserved for allocation 11.1 (a Slurm job's) is given that run only: trial 12,
    waiting in the same pool, stays queued beside the agent's free slot, and 11.1 is never
    placed on an agent of the pool that is not reserved for it."""
    log = slurm_log(trials=2)
    log.add(
        "agent-plain",
        AgentRegistered(agent_id="plain", resource_pool="other", slots=[Slot(slot_id="0")]),
    )
    assert log.step() == []
    log.add(
        "agent-slurm-100-n1",
        AgentRegistered(
            agent_id="slurm-100-n1",
            resource_pool="hpc",
            slots=[Slot(slot_id="0"), Slot(slot_id="1")],
            reserved_for=ALLOC,
        ),
    )
    [placed] = log.step()
    assert isinstance(placed, SlotsAllocated)
    assert (placed.trial_id, list(placed.placements)) == (TRIAL, ["slurm-100-n1"])
    assert log.step() == []


def test_a_job_sees_none_of_the_schedulers_environment_but_the_basics() -> None:
    """sbatch (and so the job) gets PATH, HOME, USER, LANG, TZ and SLURM_CONF only: no
    credential path or secret of the scheduler's reaches a job."""
    env = {
        "PATH": "/usr/bin", "HOME": "/root", "SLURM_CONF": "/etc/slurm/slurm.conf",
        "CAIRN_DB_FILE": "/secrets/scheduler/db", "CAIRN_NATS": "nats://scheduler:pw@x",
        "PGPASSWORD": "secret",
    }  # fmt: skip
    assert job_environment(env) == {
        "PATH": "/usr/bin", "HOME": "/root", "SLURM_CONF": "/etc/slurm/slurm.conf",
    }  # fmt: skip
    script = batch_script(
        SlurmRequest(ALLOC, "hpc", slots=1, priority=1), POOLS["hpc"].slurm, 1, "hpc"
    )
    assert "--hide /etc/cairn/join-token" in script
