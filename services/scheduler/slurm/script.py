"""The batch script of one Slurm allocation (pure text from the request and the pool).

The job asks for ``nodes`` nodes with one task each; that task is an agent reserved for the
allocation (``python -m services.agent --reserved-for``), which registers with the API, is given
the allocation by the scheduler, runs its ranks on the node's slots, and exits once the run has
ended, so the job ends with it. Every value is quoted for the shell; the options that shape the
job are cairn's (:data:`events.domain.config.resource_pools.SBATCH_ARGS_CAIRN_SETS`), each one
an ``#SBATCH`` line before the pool's and the experiment's own.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from events.domain.config.resource_pools import SlurmSettings
from services.scheduler.slurm.requests import SlurmRequest

JOB_NAME_PREFIX = "cairn-"
"""Every job cairn submits is named ``cairn-<allocation id>``: how a restarted scheduler finds
the jobs it submitted but did not record."""


class ShapeError(ValueError):
    """An allocation cannot be shaped into a job of its pool (slots do not split over nodes)."""


@dataclass(frozen=True)
class JobShape:
    """How many nodes a job asks for and how many slots on each."""

    nodes: int
    slots_per_node: int


def job_name(allocation_id: str) -> str:
    """The Slurm job name of an allocation's jobs."""
    return f"{JOB_NAME_PREFIX}{allocation_id}"


def allocation_of_job(name: str) -> str | None:
    """The allocation a job named by :func:`job_name` is for (``None``: not one of cairn's)."""
    return name[len(JOB_NAME_PREFIX) :] or None if name.startswith(JOB_NAME_PREFIX) else None


def shape(request: SlurmRequest, settings: SlurmSettings) -> JobShape:
    """The nodes and slots per node of ``request``'s job.

    Raises:
        ShapeError: its slots cannot be spread evenly over whole nodes.
    """
    per_node_max = request.slots_per_node or settings.slots_per_node
    nodes = math.ceil(request.slots / per_node_max)
    if request.slots % nodes:
        raise ShapeError(
            f"{request.slots} slots do not split evenly over {nodes} nodes of at most "
            f"{per_node_max} slots (slurm.slots_per_node)"
        )
    return JobShape(nodes=nodes, slots_per_node=request.slots // nodes)


def job_dir(settings: SlurmSettings, allocation_id: str) -> Path:
    """Where an allocation's scripts, job output and agents' work directories live."""
    return Path(settings.work_root) / "jobs" / allocation_id


def batch_script(
    request: SlurmRequest,
    settings: SlurmSettings,
    submission: int,
    pool: str,
    slurm_conf: str | None = None,
) -> str:
    """The ``sbatch`` script of ``request``'s ``submission``-th job (``slurm_conf``: the
    ``SLURM_CONF`` the job's ``srun`` needs, when Slurm's config is not where it looks).

    Raises:
        ShapeError: see :func:`shape`.
    """
    job = shape(request, settings)
    directory = job_dir(settings, request.allocation_id)
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name={job_name(request.allocation_id)}",
        f"#SBATCH --nodes={job.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={directory}/slurm-%j.out",
        "#SBATCH --no-requeue",
        f"#SBATCH --comment=cairn:{pool}:{submission}",
    ]
    if settings.slot_type == "cuda":
        lines.append(f"#SBATCH --gres=gpu:{job.slots_per_node}")
    else:
        lines.append(f"#SBATCH --cpus-per-task={job.slots_per_node}")
    if settings.partition:
        lines.append(f"#SBATCH --partition={settings.partition}")
    if settings.account:
        lines.append(f"#SBATCH --account={settings.account}")
    qos = settings.qos_for(request.priority)
    if qos:
        lines.append(f"#SBATCH --qos={qos}")
    if settings.time_limit_minutes:
        lines.append(f"#SBATCH --time={settings.time_limit_minutes}")
    if settings.preemption_warning:
        lines.append(f"#SBATCH --signal=USR2@{settings.preemption_warning}")
    if settings.priority_to_nice:
        lines.append(f"#SBATCH --nice={max(0, request.priority)}")
    lines.extend(f"#SBATCH {arg}" for arg in (*settings.sbatch_args, *request.sbatch_args))
    python = settings.python or sys.executable
    checkpoints = settings.checkpoint_root or str(Path(settings.work_root) / "checkpoints")
    agent = [
        q(python), "-m", "services.agent",
        "--agent-id", '"slurm-${SLURM_JOB_ID}-${SLURMD_NODENAME}"',
        "--work-dir", f'{q(str(directory))}/"${{SLURM_JOB_ID}}-${{SLURMD_NODENAME}}"',
        "--api-url", q(settings.api_url),
        "--nats", q(settings.nats_url),
        "--join-token-file", q(settings.join_token_file),
        "--hide", q(settings.join_token_file),
        "--resource-pool", q(pool),
        "--reserved-for", q(request.allocation_id),
        "--preempt-on-term",
        "--checkpoint-root", q(checkpoints),
    ]  # fmt: skip
    if settings.slot_type == "cpu":
        agent += ["--artificial-slots", str(job.slots_per_node)]
    inner = "exec " + " ".join(agent)
    lines += [
        "export PATH=/usr/local/bin:/usr/bin:/bin",
        "export CAIRN_LOG_LEVEL=info",
        *([f"export SLURM_CONF={q(slurm_conf)}"] if slurm_conf else []),
        *([f"export PYTHONPATH={q(settings.pythonpath)}"] if settings.pythonpath else []),
        f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 --export=ALL /bin/sh -c {q(inner)}",
        "",
    ]
    return "\n".join(lines)
