"""Resource pools a resource manager other than cairn's agents backs (the cluster config's
``resource_pools``).

A pool named here with ``resource_manager: slurm`` is Slurm's: the scheduler places nothing of
it on long-lived agents. Each allocation asked of the pool becomes one Slurm batch job, whose
script starts an agent reserved for that allocation on each of its nodes (see
``docs/slurm.md``). Everything cairn passes to ``sbatch`` comes from here or from the
experiment's ``slurm`` section; nothing in a user's config names a path or a credential the
job reads.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from events.domain.config.common import ConfigModel
from events.domain.config.models import AbsPath

_POOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", re.ASCII)
_SLURM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.,:+-]{0,127}$", re.ASCII)

SBATCH_ARGS_CAIRN_SETS = (
    "--nodes", "-N", "--ntasks", "-n", "--ntasks-per-node", "--cpus-per-task", "-c",
    "--gres", "--gpus", "-G", "--gpus-per-task", "--partition", "-p", "--job-name", "-J",
    "--output", "-o", "--error", "-e", "--chdir", "-D", "--export", "--comment",
    "--signal", "--nice", "--requeue", "--no-requeue", "--wrap", "--parsable",
    "--account", "-A", "--qos", "-q", "--uid", "--gid", "--get-user-env",
)  # fmt: skip
"""``sbatch`` options cairn sets itself (and so refuses in ``sbatch_args``): the shape of the
job, where its output goes, its environment, and whom it runs as and bills (the pool's
``account`` and ``qos``, never a user's config)."""


def _pool_name(value: str) -> str:
    if not _POOL_NAME.fullmatch(value):
        raise ValueError(
            "must be 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return value


def _slurm_name(value: str) -> str:
    if not _SLURM_NAME.fullmatch(value):
        raise ValueError("must be a Slurm name: letters, digits and _.,:+- (at most 128)")
    return value


def sbatch_arg_problem(arg: str) -> str | None:
    """Why ``arg`` may not be passed to ``sbatch`` by a config, or ``None`` when it may.

    An argument is one ``--option=value`` (or ``-X value`` written as one word): the options
    that shape the job (:data:`SBATCH_ARGS_CAIRN_SETS`) are cairn's, and no argument may hold
    a newline or a NUL (each becomes one ``#SBATCH`` line of the script).
    """
    if not arg or len(arg) > 512:
        return "must be 1-512 characters"
    if any(c in arg for c in "\n\r\0"):
        return "must not hold a newline or NUL"
    if not arg.startswith("-"):
        return "must be an option (start with '-')"
    name = arg.split("=", 1)[0]
    for taken in SBATCH_ARGS_CAIRN_SETS:
        if name == taken or (
            len(taken) == 2 and arg.startswith(taken) and not arg.startswith("--")
        ):
            return f"{taken} is set by cairn from the allocation"
    return None


def _sbatch_args(values: list[str]) -> list[str]:
    for index, arg in enumerate(values):
        problem = sbatch_arg_problem(arg)
        if problem is not None:
            raise ValueError(f"[{index}] {arg[:80]!r}: {problem}")
    return values


SbatchArgs = Annotated[list[str], AfterValidator(_sbatch_args)]
"""Extra ``sbatch`` options, each checked by :func:`sbatch_arg_problem`."""


class PriorityQos(ConfigModel):
    """A QoS for the jobs of a band of cairn priorities.

    Attributes:
        max_priority: jobs whose priority is at most this (lower runs first) get ``qos``.
        qos: the Slurm QoS.
    """

    max_priority: int = Field(ge=1, le=99)
    qos: Annotated[str, AfterValidator(_slurm_name)]


class SlurmSettings(ConfigModel):
    """How cairn submits a Slurm pool's allocations.

    Attributes:
        partition: the partition jobs are submitted to (``None``: Slurm's default).
        account: ``--account`` of every job (``None``: the submitting user's default).
        qos: ``--qos`` of every job (``None``: the association's default).
        slot_type: ``cpu``: a slot is a CPU (``--cpus-per-task``); ``cuda``: a GPU
            (``--gres=gpu:N``).
        slots_per_node: the most slots one node gives one allocation; an allocation of more
            spans ``ceil(slots / slots_per_node)`` nodes (an experiment's ``slurm.slots_per_node``
            overrides it).
        sbatch_args: options added to every job of the pool (before the experiment's).
        time_limit_minutes: ``--time`` of every job (``None``: the partition's limit).
        preemption_warning: seconds before a job's time limit at which Slurm signals its agents
            (``--signal=USR2@N``) so the trial checkpoints and is requeued, not killed.
        priority_to_nice: whether cairn's priority (1-99, lower first) becomes ``--nice``.
        priority_qos: QoS by priority band, the first whose ``max_priority`` is at least the
            job's priority (none matches: ``qos``).
        api_url: the URL the nodes reach cairn's API by.
        nats_url: the NATS URL the nodes reach the bus by.
        join_token_file: the cluster's join token, readable by the jobs' user on every node
            (mode 0600); each job's agents present it once for their own credential.
        work_root: a directory shared by the scheduler's host and every node: job scripts,
            job output and the agents' work directories.
        python: the interpreter with cairn installed on the nodes.
        pythonpath: ``PYTHONPATH`` of the jobs' agents (a source checkout of cairn shared with
            the nodes; ``None``: cairn is installed in ``python``'s environment).
        checkpoint_root: the agents' default checkpoint storage (shared by the nodes; ``None``:
            ``<work_root>/checkpoints``).
        poll_seconds: seconds between two reads of ``squeue``.
        max_submissions: submissions of one allocation whose jobs all ended before it ran, after
            which the trial (or task) gives up with Slurm's reason.
    """

    partition: Annotated[str, AfterValidator(_slurm_name)] | None = None
    account: Annotated[str, AfterValidator(_slurm_name)] | None = None
    qos: Annotated[str, AfterValidator(_slurm_name)] | None = None
    slot_type: Literal["cpu", "cuda"] = "cpu"
    slots_per_node: int = Field(1, ge=1, le=1024)
    sbatch_args: SbatchArgs = Field(default_factory=list, max_length=64)
    time_limit_minutes: int | None = Field(None, ge=1, le=525600)
    preemption_warning: int = Field(60, ge=0, le=3600)
    priority_to_nice: bool = True
    priority_qos: list[PriorityQos] = Field(default_factory=list, max_length=99)
    api_url: str = Field(min_length=1, max_length=2048)
    nats_url: str = Field(min_length=1, max_length=2048)
    join_token_file: AbsPath
    work_root: AbsPath
    python: AbsPath | None = None
    pythonpath: AbsPath | None = None
    checkpoint_root: AbsPath | None = None
    poll_seconds: float = Field(2.0, gt=0, le=300)
    max_submissions: int = Field(3, ge=1, le=100)

    def qos_for(self, priority: int) -> str | None:
        """The QoS of a job of cairn priority ``priority``."""
        for band in sorted(self.priority_qos, key=lambda b: b.max_priority):
            if priority <= band.max_priority:
                return band.qos
        return self.qos


class ResourcePool(ConfigModel):
    """One pool of the cluster config's ``resource_pools``.

    Attributes:
        pool_name: the pool experiments and tasks name in ``resources.resource_pool``.
        description: shown with the pool.
        resource_manager: who owns the pool's nodes (``slurm``).
        slurm: how its jobs are submitted.
    """

    pool_name: Annotated[str, AfterValidator(_pool_name)]
    description: str = Field("", max_length=1000)
    resource_manager: Literal["slurm"]
    slurm: SlurmSettings
