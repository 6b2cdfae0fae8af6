"""What the log asks of the Slurm pools: every trial run and task waiting for its slots in one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from events.domain import lifecycle
from events.domain.aggregates import Cluster
from events.domain.config.resource_pools import ResourcePool
from events.domain.names import allocation_id, task_allocation_id


@dataclass(frozen=True)
class SlurmRequest:
    """One allocation a Slurm pool is asked for.

    Attributes:
        allocation_id: the allocation (trial ``<id>.<run>``, task ``task-<id>.1``).
        pool: the pool's name.
        slots: the slots it needs in all.
        priority: cairn's priority (lower runs first).
        trial_id: the trial, for a trial's run.
        task_id: the task, for a task.
        slots_per_node: the experiment's ``slurm.slots_per_node`` (``None``: the pool's).
        sbatch_args: the experiment's ``slurm.sbatch_args``.
        order: the log position of the request (older first).
    """

    allocation_id: str
    pool: str
    slots: int
    priority: int
    trial_id: int | None = None
    task_id: str | None = None
    slots_per_node: int | None = None
    sbatch_args: tuple[str, ...] = ()
    order: int = 0


def pending_requests(
    cluster: Cluster, pools: Mapping[str, ResourcePool], default_pool: str
) -> list[SlurmRequest]:
    """The trial runs and tasks waiting for slots in one of ``pools`` (the scheduler would place
    them now if the pool had agents), oldest first."""
    found: list[SlurmRequest] = []
    for trial in cluster.trials.values():
        exp = cluster.experiments.get(trial.experiment_id)
        if exp is None or not trial.live or trial.run is not None:
            continue
        if trial.kill_requested or trial.stop_requested or exp.state != lifecycle.ACTIVE:
            continue
        pool = exp.settings.pool or default_pool
        if pool not in pools:
            continue
        slurm = exp.config.get("slurm") or {}
        per_node = slurm.get("slots_per_node") if isinstance(slurm, dict) else None
        args = slurm.get("sbatch_args") if isinstance(slurm, dict) else None
        found.append(
            SlurmRequest(
                allocation_id=allocation_id(trial.trial_id, trial.run_id + 1),
                pool=pool,
                slots=max(1, exp.settings.slots_per_trial),
                priority=exp.settings.priority,
                trial_id=trial.trial_id,
                slots_per_node=per_node if isinstance(per_node, int) else None,
                sbatch_args=tuple(a for a in args or () if isinstance(a, str)),
                order=trial.requested_position,
            )
        )
    for task in cluster.tasks.values():
        if not task.exists or task.ended or task.allocation_id is not None or task.kill_requested:
            continue
        resources = task.config.resources
        pool = resources.resource_pool or default_pool
        if pool not in pools:
            continue
        found.append(
            SlurmRequest(
                allocation_id=task_allocation_id(task.task_id),
                pool=pool,
                slots=max(1, resources.slots),
                priority=resources.priority,
                task_id=task.task_id,
                order=task.requested_position,
            )
        )
    return sorted(found, key=lambda r: (r.order, r.allocation_id))
