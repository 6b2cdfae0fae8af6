"""Facts on a Slurm allocation's stream (``slurm-<allocation id>``, see
:func:`events.domain.names.slurm_stream`).

An allocation asked of a Slurm pool becomes a batch job (``SlurmJobSubmitted``); what ``squeue``
shows of it is recorded when it changes (``SlurmJobObserved``: pending with Slurm's reason,
running on which nodes, and how it ended); cairn's own ``scancel`` is recorded before it is sent
(``SlurmJobCancelRequested``); a job ``sbatch`` refused is ``SlurmJobRefused``. An allocation may
take several submissions when its jobs end before they run (a node failed at boot, an admin
cancelled it while pending), at most the pool's ``max_submissions``.
"""

from __future__ import annotations

from pydantic import Field

from events.log.envelope import Event
from events.log.registry import register

SLURM_END_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "VANISHED",
    }
)
"""Job states after which nothing of the job runs. ``VANISHED`` is cairn's: the job is no longer
in ``squeue`` (Slurm forgets an ended job after its ``MinJobAge``) and was not seen ending."""


@register
class SlurmJobSubmitted(Event):
    """Allocation ``allocation_id`` (of trial ``trial_id`` or task ``task_id``) was submitted to
    Slurm pool ``pool`` as job ``job_id``, its ``submission``-th job. ``adopted``: the job was
    found in ``squeue`` under the allocation's name (submitted before a crash that kept this
    fact from being recorded) and taken as the allocation's job instead of a second one."""

    event_type = "SlurmJobSubmitted"

    allocation_id: str
    job_id: str
    pool: str
    trial_id: int | None = None
    task_id: str | None = None
    nodes: int = Field(ge=1)
    slots_per_node: int = Field(ge=1)
    submission: int = Field(ge=1)
    adopted: bool = False


@register
class SlurmJobObserved(Event):
    """``squeue`` showed job ``job_id`` in ``state`` (``PENDING``, ``RUNNING``, or an end
    state of :data:`SLURM_END_STATES`), with Slurm's ``reason`` (why it waits, or why it
    ended) and the ``nodes`` it runs on. Recorded when the state or the reason changes."""

    event_type = "SlurmJobObserved"

    allocation_id: str
    job_id: str
    state: str
    reason: str = ""
    nodes: list[str] = Field(default_factory=list)


@register
class SlurmJobCancelRequested(Event):
    """cairn decided to ``scancel`` job ``job_id`` (recorded before the command is sent): its
    allocation ended, was killed, or was never to run."""

    event_type = "SlurmJobCancelRequested"

    allocation_id: str
    job_id: str
    reason: str


@register
class SlurmJobRefused(Event):
    """``sbatch`` refused the allocation's job (an invalid option, an unknown partition or
    account); ``error`` is what it printed."""

    event_type = "SlurmJobRefused"

    allocation_id: str
    pool: str
    error: str
