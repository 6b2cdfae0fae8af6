"""What the Slurm pools call for: a pure function of the folded log, the pools and one ``squeue``
reading, tested as such.

For each allocation a Slurm pool is asked for (:mod:`.requests`), a job is submitted unless one
of its jobs may still run; a job ``squeue`` shows under the allocation's name that the log does
not hold (submitted before a crash kept it from being recorded) is adopted instead of a second
one. Every change ``squeue`` shows of a recorded job is recorded. A job nothing needs any more
(its trial or task ended or was killed before it ran, its run ended and the job lingers) is
cancelled, and so is a job of cairn's that no allocation can take (an orphan of a crash). A job
that ended while its run was placed and not yet ended gives the run its exit, as an agent's
report would, so the usual restart rules apply; an allocation whose jobs all ended before they
ran is submitted again, at most ``max_submissions`` times, then given up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from events.domain import lifecycle
from events.domain.aggregates import Cluster
from events.domain.aggregates.slurm import SlurmAllocation, SlurmAllocations, SlurmJob
from events.domain.config.resource_pools import ResourcePool
from events.domain.deciders.trial import Outcome
from events.domain.names import parse_allocation_id, task_of_allocation
from events.domain.types.slurm import SLURM_END_STATES
from services.scheduler.slurm.commands import Queue, QueuedJob
from services.scheduler.slurm.requests import SlurmRequest, pending_requests


@dataclass(frozen=True)
class Submit:
    """Submit ``request``'s ``submission``-th job."""

    request: SlurmRequest
    submission: int


@dataclass(frozen=True)
class Adopt:
    """Record ``job`` (found in ``squeue``) as ``request``'s ``submission``-th job."""

    request: SlurmRequest
    job: QueuedJob
    submission: int


@dataclass(frozen=True)
class Observe:
    """Record what ``squeue`` shows of a recorded job (``job.state`` may be ``VANISHED``)."""

    allocation_id: str
    job: QueuedJob


@dataclass(frozen=True)
class Cancel:
    """Record the decision to cancel job ``job_id``, then ``scancel`` it."""

    allocation_id: str
    job_id: str
    reason: str


@dataclass(frozen=True)
class EndRun:
    """The run of ``allocation_id`` ended with its job: record its exit (``outcome``)."""

    allocation_id: str
    trial_id: int | None
    task_id: str | None
    outcome: Outcome
    message: str


@dataclass(frozen=True)
class GiveUp:
    """``request`` cannot be run by its pool (``sbatch`` refused it, or every job ended before
    it ran): end its trial or task with ``reason``."""

    request: SlurmRequest
    reason: str


Action = Submit | Adopt | Observe | Cancel | EndRun | GiveUp

TRIAL_OUTCOME: dict[str, Outcome] = {
    "PREEMPTED": "preempted",
    "TIMEOUT": "failed",
    "OUT_OF_MEMORY": "failed",
    "DEADLINE": "failed",
}
"""The outcome of a trial's run whose job ended in a state while the run was going on and its
agent did not report the run's end (any other end state: ``lost``, a restart that counts as no
failure of the trial's). The job's script is the agent: a job ``FAILED`` is an agent that died,
which the trial's own failures (reported by the agent) never are; a time or memory limit the
trial did not leave in time counts against its ``max_restarts``."""


def decide(
    cluster: Cluster,
    slurm: SlurmAllocations,
    pools: Mapping[str, ResourcePool],
    default_pool: str,
    queue: Queue,
    queue_from: int,
    lingering: frozenset[str] = frozenset(),
) -> list[Action]:
    """Every action the state calls for, in a deterministic order.

    Args:
        cluster: the folded cluster (trials, tasks, experiments, agents).
        slurm: the folded Slurm allocations.
        pools: the Slurm pools, by name.
        default_pool: the pool of configs that name none.
        queue: a ``squeue`` reading.
        queue_from: the log position folded when that reading began: a job recorded after it
            may be missing from it and is not judged by it.
        lingering: jobs whose run ended a while ago (the caller's clock), still running.
    """
    actions: list[Action] = []
    requests = pending_requests(cluster, pools, default_pool)
    for request in requests:
        actions.extend(
            _for_request(
                request, slurm.allocations.get(request.allocation_id), queue, pools[request.pool]
            )
        )
    pending = {r.allocation_id for r in requests}
    recorded: set[str] = set()
    for alloc, job in slurm.live_jobs():
        recorded.add(job.job_id)
        seen = queue.jobs.get(job.job_id)
        if seen is None and job.submitted_position > queue_from:
            continue
        if seen is None:
            seen = QueuedJob(job.job_id, alloc.allocation_id, "VANISHED", "no longer in squeue")
        if (seen.state, seen.reason) != (job.state, job.reason):
            actions.append(Observe(alloc.allocation_id, seen))
        if seen.state in SLURM_END_STATES:
            end = _run_end(cluster, alloc, seen)
            if end is not None:
                actions.append(end)
            continue
        if job.cancel_requested:
            continue
        why = _unneeded(cluster, alloc, job, pending, lingering)
        if why is not None:
            actions.append(Cancel(alloc.allocation_id, job.job_id, why))
    for alloc in slurm.allocations.values():
        recorded.update(j.job_id for j in alloc.jobs)
    adopted = {a.job.job_id for a in actions if isinstance(a, Adopt)}
    for job_id in sorted(queue.jobs, key=int):
        seen = queue.jobs[job_id]
        if job_id in recorded or job_id in adopted or seen.state in SLURM_END_STATES:
            continue
        actions.append(Cancel(seen.allocation_id, job_id, "no allocation of cairn's needs it"))
    return actions


def _for_request(
    request: SlurmRequest, alloc: SlurmAllocation | None, queue: Queue, pool: ResourcePool
) -> list[Action]:
    if alloc is not None and alloc.refused is not None:
        return [GiveUp(request, f"Slurm refused the job: {alloc.refused}")]
    jobs = alloc.jobs if alloc is not None else []
    if any(not j.ended for j in jobs):
        return []
    known = {j.job_id for j in jobs}
    for found in sorted(queue.named_for(request.allocation_id), key=lambda j: int(j.job_id)):
        if found.job_id not in known and found.state not in SLURM_END_STATES:
            return [Adopt(request, found, len(jobs) + 1)]
    if len(jobs) >= pool.slurm.max_submissions:
        last = jobs[-1]
        return [
            GiveUp(
                request,
                f"{len(jobs)} Slurm jobs ended before they ran (the last, {last.job_id}: "
                f"{last.state} {last.reason})".strip(),
            )
        ]
    return [Submit(request, len(jobs) + 1)]


def run_state(cluster: Cluster, allocation_id: str) -> tuple[bool, bool]:
    """Whether the allocation was placed, and whether its run has ended."""
    task_id = task_of_allocation(allocation_id)
    if task_id is not None:
        task = cluster.tasks.get(task_id)
        if task is None or task.allocation_id != allocation_id:
            return False, False
        return True, task.ended
    try:
        trial_id, run_id = parse_allocation_id(allocation_id)
    except ValueError:
        return False, False
    trial = cluster.trials.get(trial_id)
    if trial is None or trial.run_id < run_id:
        return False, False
    run = trial.run
    if trial.run_id == run_id and run is not None and run.allocation_id == allocation_id:
        return True, run.exited
    return True, True


def _run_end(cluster: Cluster, alloc: SlurmAllocation, seen: QueuedJob) -> EndRun | None:
    placed, ended = run_state(cluster, alloc.allocation_id)
    if not placed or ended:
        return None
    message = f"Slurm job {seen.job_id} {seen.state}" + (f": {seen.reason}" if seen.reason else "")
    if alloc.task_id is not None:
        failed = seen.state in TRIAL_OUTCOME
        return EndRun(
            alloc.allocation_id, None, alloc.task_id, "failed" if failed else "lost", message
        )
    return EndRun(
        alloc.allocation_id, alloc.trial_id, None, TRIAL_OUTCOME.get(seen.state, "lost"), message
    )


def _unneeded(
    cluster: Cluster,
    alloc: SlurmAllocation,
    job: SlurmJob,
    pending: set[str],
    lingering: frozenset[str],
) -> str | None:
    """Why a live job is to be cancelled, or ``None`` while its allocation may use it."""
    if alloc.job is not job:
        return "a later job of the allocation replaced it"
    placed, ended = run_state(cluster, alloc.allocation_id)
    if placed:
        if ended and job.job_id in lingering:
            return "its run ended"
        return None
    if alloc.allocation_id in pending:
        return None
    if alloc.trial_id is not None:
        trial = cluster.trials.get(alloc.trial_id)
        if trial is not None and trial.live:
            exp = cluster.experiments.get(trial.experiment_id)
            if exp is not None and exp.state == lifecycle.PAUSED:
                return "its experiment was paused before the job ran"
    return "its trial or task no longer waits for it"
