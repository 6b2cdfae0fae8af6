"""Facts on a trial's stream (``trial-<id>``, see :mod:`events.domain.names`).

Every type here stored ``trial_id`` as a string ``"<experiment>.<n>"`` before trial ids were
integers; its next schema version holds the integer, and the upcaster maps an old id with
:func:`events.domain.types.legacy.integer_trial_id`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from events.domain.types.legacy import integer_trial_id
from events.log.envelope import Event
from events.log.registry import register, upcaster


@register
class SlotsAllocated(Event):
    """The scheduler placed a trial's run: all its slots at once (gang), maybe on several agents."""

    event_type = "SlotsAllocated"
    schema_version = 2

    trial_id: int
    allocation_id: str
    placements: dict[str, list[str]] = Field(description="agent id -> slot ids")
    run_id: int = 1


@register
class TrialStarted(Event):
    """An agent started a trial's process for one run (a restart starts a new run).

    v2 adds which process of the agent started it (``agent_incarnation``) and ``listed_from``:
    every heartbeat of that incarnation numbered ``listed_from`` or later lists the allocation
    until the run's exit is reported, so one that does not means the agent lost the run.
    v1 payloads (no such promise) are upcast with ``""`` and ``None``.
    """

    event_type = "TrialStarted"
    schema_version = 3

    trial_id: int
    allocation_id: str
    run_id: int
    agent_id: str
    restored_checkpoint: str | None = None
    agent_incarnation: str = ""
    listed_from: int | None = Field(None, ge=1)


@upcaster("TrialStarted", 1)
def _trial_started_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "agent_incarnation": "", "listed_from": None}


@register
class WorkloadCompleted(Event):
    """A training workload finished: summary training metrics at ``steps_completed``."""

    event_type = "WorkloadCompleted"
    schema_version = 2

    trial_id: int
    run_id: int
    steps_completed: int
    metrics: dict[str, float]


@register
class ValidationReported(Event):
    """A validation finished: validation metrics at ``steps_completed``."""

    event_type = "ValidationReported"
    schema_version = 2

    trial_id: int
    run_id: int
    steps_completed: int
    metrics: dict[str, float]


@register
class CheckpointSaved(Event):
    """A checkpoint directory was written and is complete."""

    event_type = "CheckpointSaved"
    schema_version = 2

    trial_id: int
    run_id: int
    uuid: str
    steps_completed: int
    resources: dict[str, int] = Field(default_factory=dict, description="relative path -> bytes")
    metadata: dict[str, Any] = Field(default_factory=dict)


@register
class TrialExited(Event):
    """A trial run's process ended.

    v1 stored ``failed: bool``; v2 says how the run ended in ``outcome``.
    """

    event_type = "TrialExited"
    schema_version = 3

    trial_id: int
    run_id: int
    allocation_id: str
    outcome: Literal["completed", "failed", "killed", "preempted", "lost"]
    exit_code: int | None = None
    message: str = ""


@register
class SlotsReleased(Event):
    """The slots of an allocation are free again."""

    event_type = "SlotsReleased"
    schema_version = 2

    trial_id: int
    allocation_id: str
    placements: dict[str, list[str]]


@upcaster("TrialExited", 1)
def _trial_exited_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    data = dict(payload)
    failed = data.pop("failed", False)
    data["outcome"] = "failed" if failed else "completed"
    return data


@register
class TrialStateChanged(Event):
    """A trial moved to a new state (ACTIVE, PAUSED, STOPPING_*, COMPLETED, CANCELED, ERROR)."""

    event_type = "TrialStateChanged"
    schema_version = 2

    trial_id: int
    state: str
    reason: str = ""


@register
class TrialRestarted(Event):
    """A failed or lost run will be retried from the latest checkpoint; ``restarts`` counts failures."""

    event_type = "TrialRestarted"
    schema_version = 2

    trial_id: int
    restarts: int
    latest_checkpoint: str | None = None
    reason: str = ""


@register
class PreemptionRequested(Event):
    """An allocation was asked to checkpoint and exit (pause, cancel, searcher stop, priority)."""

    event_type = "PreemptionRequested"
    schema_version = 2

    trial_id: int
    allocation_id: str
    reason: str
    agent_ids: list[str] = Field(default_factory=list)


@register
class KillRequested(Event):
    """An allocation is to be terminated now (SIGTERM, then SIGKILL)."""

    event_type = "KillRequested"
    schema_version = 2

    trial_id: int
    allocation_id: str
    reason: str
    agent_ids: list[str] = Field(default_factory=list)


@register
class TrialEarlyExited(Event):
    """The training code ended the trial early (invalid hyperparameters or its own decision)."""

    event_type = "TrialEarlyExited"
    schema_version = 2

    trial_id: int
    reason: Literal["invalid_hp", "user_requested_stop", "errored"]


@register
class TrialKillRequested(Event):
    """A user asked to kill one trial; it ends CANCELED whatever its experiment does."""

    event_type = "TrialKillRequested"
    schema_version = 2

    trial_id: int
    actor: str = ""


@register
class MetricsReported(Event):
    """Metrics of a group other than ``training`` and ``validation`` (e.g. ``inference``)."""

    event_type = "MetricsReported"
    schema_version = 2

    trial_id: int
    run_id: int
    group: str
    steps_completed: int
    metrics: dict[str, float]


@register
class TrialAlerted(Event):
    """The training code raised an alert (``ctx.alert(title, description, level)``)."""

    event_type = "TrialAlerted"
    schema_version = 2

    trial_id: int
    run_id: int
    title: str = ""
    description: str = ""
    level: Literal["warn", "info", "debug", "error"] = "info"


@register
class RendezvousJoined(Event):
    """One agent of a run's gang launched its part's setup and says where it can be reached.

    The rendezvous of a run placed on several agents completes once every agent of its
    ``SlotsAllocated`` placements has joined; the chief (the first agent id in sorted order)
    hosts the collective's store at ``address:port``.
    """

    event_type = "RendezvousJoined"
    schema_version = 1

    trial_id: int
    allocation_id: str
    agent_id: str
    address: str
    port: int = Field(ge=1, le=65535)


for _model in (
    SlotsAllocated,
    TrialStarted,
    WorkloadCompleted,
    ValidationReported,
    CheckpointSaved,
    TrialExited,
    SlotsReleased,
    TrialStateChanged,
    TrialRestarted,
    PreemptionRequested,
    KillRequested,
    TrialEarlyExited,
    TrialKillRequested,
    MetricsReported,
    TrialAlerted,
):
    upcaster(_model.event_type, _model.schema_version - 1)(integer_trial_id)
