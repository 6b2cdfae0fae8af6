"""The job queue: every trial and task that holds slots or waits for them, in placement order.

A *job* here is what the scheduler places: a trial of an active experiment or a task. The
order is the scheduler's own (``services.scheduler.policy``): the jobs that hold an allocation
first, in the order they were placed, then the waiting ones by priority (lower first), then
request position, then request id, which is the order in which the scheduler tries to place
them in each pool. A pure read of a :class:`~events.domain.aggregates.cluster.Cluster`: no
clock, no I/O, so the queue "as it was at position p" is this function over that fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from events.domain import lifecycle
from events.domain.aggregates.cluster import Cluster
from events.domain.names import allocation_id, task_allocation_id

QUEUED = "QUEUED"
"""A job waiting for slots."""


@dataclass(frozen=True, slots=True)
class Job:
    """One row of the queue (``resource_pool`` ``""``: the default pool)."""

    kind: str
    """``trial`` or the task's kind (``command``)."""
    job_id: str
    """The trial id (as text) or the task id."""
    experiment_id: int | None
    name: str
    owner: str
    state: str
    """``QUEUED``, ``ASSIGNED`` (placed, not started) or ``RUNNING``."""
    priority: int
    slots: int
    resource_pool: str
    submitted_at: datetime | None
    order: tuple[int, int, str]
    """The sort key: placed jobs by allocation position, waiting ones by
    (priority, request position, request id), placed before waiting."""

    @property
    def allocation_id(self) -> str:
        """The allocation the job holds, or the one it waits for."""
        return self.order[2]


def job_queue(cluster: Cluster) -> list[Job]:
    """The trials and tasks of ``cluster`` that hold slots or wait for them, in queue order."""
    placed: list[Job] = []
    waiting: list[Job] = []
    for trial in cluster.trials.values():
        exp = cluster.experiments.get(trial.experiment_id)
        if exp is None or not trial.live:
            continue
        run = trial.run
        if run is not None and run.exited:
            continue
        if run is None and exp.state != lifecycle.ACTIVE:
            continue
        settings = exp.settings
        request = allocation_id(trial.trial_id, trial.run_id + 1)
        job = Job(
            kind="trial",
            job_id=str(trial.trial_id),
            experiment_id=exp.experiment_id,
            name=str(exp.config.get("name") or ""),
            owner=exp.owner,
            state=QUEUED if run is None else run.state,
            priority=settings.priority,
            slots=settings.slots_per_trial,
            resource_pool=settings.pool,
            submitted_at=exp.requested_at.get(trial.trial_id),
            order=(
                (0, run.position, run.allocation_id)
                if run is not None
                else (settings.priority, trial.requested_position, request)
            ),
        )
        if run is None:
            waiting.append(job)
        else:
            placed.append(job)
    for task in cluster.tasks.values():
        if not task.exists or task.ended:
            continue
        resources = task.config.resources
        request = task.allocation_id or task_allocation_id(task.task_id)
        allocated = task.allocation_id is not None
        job = Job(
            kind=task.kind,
            job_id=task.task_id,
            experiment_id=None,
            name=task.description,
            owner=task.owner,
            state=task.state,
            priority=resources.priority,
            slots=resources.slots,
            resource_pool=resources.resource_pool,
            submitted_at=task.requested_at,
            order=(
                (0, task.allocated_position, request)
                if allocated
                else (resources.priority, task.requested_position, request)
            ),
        )
        if allocated:
            placed.append(job)
        else:
            waiting.append(job)
    placed.sort(key=lambda job: job.order)
    waiting.sort(key=lambda job: job.order)
    return placed + waiting
