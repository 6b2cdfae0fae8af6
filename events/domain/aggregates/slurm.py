"""The Slurm allocations fold (streams ``slurm-<allocation id>``): each allocation asked of a
Slurm pool, with the jobs submitted for it and what ``squeue`` last showed of each."""

from __future__ import annotations

from dataclasses import dataclass, field

from events.domain.names import SLURM_PREFIX
from events.domain.types.slurm import (
    SLURM_END_STATES,
    SlurmJobCancelRequested,
    SlurmJobObserved,
    SlurmJobRefused,
    SlurmJobSubmitted,
)
from events.log.envelope import Event, RecordedEvent

SLURM_FACTS = (
    "SlurmJobSubmitted",
    "SlurmJobObserved",
    "SlurmJobCancelRequested",
    "SlurmJobRefused",
)
"""The event types :func:`apply_slurm` folds."""


@dataclass
class SlurmJob:
    """One batch job of an allocation, as last observed."""

    job_id: str
    submission: int
    state: str = "SUBMITTED"
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    cancel_requested: bool = False
    submitted_position: int = 0

    @property
    def ended(self) -> bool:
        """Whether nothing of the job runs any more."""
        return self.state in SLURM_END_STATES


@dataclass
class SlurmAllocation:
    """One allocation's stream folded."""

    allocation_id: str
    version: int = 0
    pool: str = ""
    trial_id: int | None = None
    task_id: str | None = None
    jobs: list[SlurmJob] = field(default_factory=list)
    refused: str | None = None

    @property
    def job(self) -> SlurmJob | None:
        """The latest job submitted, if any."""
        return self.jobs[-1] if self.jobs else None

    def find(self, job_id: str) -> SlurmJob | None:
        """The job ``job_id`` of this allocation, if it is one."""
        return next((j for j in self.jobs if j.job_id == job_id), None)


@dataclass
class SlurmAllocations:
    """Every Slurm allocation, by allocation id."""

    allocations: dict[str, SlurmAllocation] = field(default_factory=dict)
    position: int = 0
    """The log position of the last event applied (an event at or below it is skipped)."""

    def apply(self, recorded: RecordedEvent) -> None:
        """Folds one event of a ``slurm-`` stream (others, and events folded before, are
        ignored)."""
        if recorded.position <= self.position:
            return
        self.position = recorded.position
        if not recorded.stream_id.startswith(SLURM_PREFIX) or recorded.type not in SLURM_FACTS:
            return
        allocation_id = recorded.stream_id[len(SLURM_PREFIX) :]
        view = self.allocations.setdefault(allocation_id, SlurmAllocation(allocation_id))
        apply_slurm(view, recorded.decode(), recorded.position)
        view.version = recorded.stream_version

    def live_jobs(self) -> list[tuple[SlurmAllocation, SlurmJob]]:
        """Every job not known to have ended, oldest first."""
        found = [(a, j) for a in self.allocations.values() for j in a.jobs if not j.ended]
        return sorted(found, key=lambda aj: aj[1].submitted_position)


def apply_slurm(view: SlurmAllocation, event: Event, position: int = 0) -> None:
    """Applies one fact of the allocation's stream to ``view`` (pure)."""
    if isinstance(event, SlurmJobSubmitted):
        view.pool = event.pool
        view.trial_id = event.trial_id
        view.task_id = event.task_id
        if view.find(event.job_id) is None:
            view.jobs.append(SlurmJob(event.job_id, event.submission, submitted_position=position))
    elif isinstance(event, SlurmJobObserved):
        job = view.find(event.job_id)
        if job is not None:
            job.state = event.state
            job.reason = event.reason
            job.nodes = list(event.nodes) or job.nodes
    elif isinstance(event, SlurmJobCancelRequested):
        job = view.find(event.job_id)
        if job is not None:
            job.cancel_requested = True
    elif isinstance(event, SlurmJobRefused):
        view.pool = event.pool
        view.refused = event.error
