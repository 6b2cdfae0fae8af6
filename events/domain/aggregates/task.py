"""The task fold: a task's request, its one allocation, its start, a kill request, its exit.

A task's life is ``QUEUED`` (requested) -> ``ASSIGNED`` (allocated) -> ``RUNNING`` (started) ->
``TERMINATED`` (exited); it may end from any earlier state (canceled before it ran, or its
allocation lost). It runs at most once: nothing after ``TaskExited`` changes it, and a second
allocation or exit is ignored, so a replayed or raced decision cannot resurrect it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from events.domain.authorization import DEFAULT_WORKSPACE_ID
from events.domain.config.task import TaskConfig
from events.domain.types import (
    TaskAllocated,
    TaskExited,
    TaskKillRequested,
    TaskReady,
    TaskRequested,
    TaskStarted,
)
from events.domain.types.task import TensorboardSource
from events.log.envelope import Event, RecordedEvent

TASK_FACTS = (
    "TaskRequested",
    "TaskAllocated",
    "TaskStarted",
    "TaskReady",
    "TaskKillRequested",
    "TaskExited",
)
"""What :func:`apply_task` reads."""

QUEUED = "QUEUED"
ASSIGNED = "ASSIGNED"
RUNNING = "RUNNING"
TERMINATED = "TERMINATED"


@dataclass
class TaskView:
    """A task's stream folded."""

    task_id: str
    version: int = 0
    kind: str = ""
    owner: str = ""
    config: TaskConfig = field(default_factory=TaskConfig)
    argv: list[str] = field(default_factory=list)
    code_ref: str | None = None
    description: str = ""
    tensorboard_sources: list[TensorboardSource] = field(default_factory=list)
    """What a ``tensorboard`` shows (empty for other kinds)."""
    workspace_id: int = DEFAULT_WORKSPACE_ID
    """The workspace the task lives in (its roles decide who else may see or change it)."""
    state: str = ""
    requested_position: int = 0
    requested_at: datetime | None = None
    allocation_id: str | None = None
    placements: dict[str, list[str]] = field(default_factory=dict)
    run_id: int = 0
    allocated_position: int = 0
    allocated_at: datetime | None = None
    agent_id: str | None = None
    started_at: datetime | None = None
    address: str | None = None
    """Where the task's server accepts connections (``TaskReady``; a kind that serves HTTP)."""
    port: int | None = None
    ready_at: datetime | None = None
    kill_requested: bool = False
    kill_reason: str = ""
    kill_agents: list[str] = field(default_factory=list)
    """The agents a kill request was sent to (empty: none was, e.g. the task was queued)."""
    outcome: str | None = None
    exit_code: int | None = None
    message: str = ""
    ended_at: datetime | None = None

    @property
    def exists(self) -> bool:
        """Whether the task was requested."""
        return bool(self.state)

    @property
    def ended(self) -> bool:
        """Whether the task has exited (or was canceled)."""
        return self.state == TERMINATED

    @property
    def ready(self) -> bool:
        """Whether the task's server is up and the task has not ended (the proxy's target)."""
        return self.address is not None and not self.ended

    @property
    def allocated(self) -> bool:
        """Whether the task holds an allocation now (allocated and not exited)."""
        return self.allocation_id is not None and not self.ended


def apply_task(view: TaskView, recorded: RecordedEvent, event: Event | None = None) -> None:
    """Folds one event of the task's stream (``event``: ``recorded`` already decoded)."""
    view.version = recorded.stream_version
    if recorded.type not in TASK_FACTS:
        return
    if event is None:
        event = recorded.decode()
    if isinstance(event, TaskRequested):
        if view.exists:
            return
        view.kind = event.kind
        view.owner = event.owner
        view.config = TaskConfig.model_validate(event.config)
        view.argv = list(event.argv)
        view.code_ref = event.code_ref
        view.description = event.description
        view.tensorboard_sources = list(event.tensorboard_sources)
        view.workspace_id = event.workspace_id
        view.state = QUEUED
        view.requested_position = recorded.position
        view.requested_at = recorded.recorded_at
    elif not view.exists or view.ended:
        return
    elif isinstance(event, TaskAllocated):
        if view.allocation_id is None:
            view.allocation_id = event.allocation_id
            view.placements = {a: list(s) for a, s in event.placements.items()}
            view.run_id = event.run_id
            view.allocated_position = recorded.position
            view.allocated_at = recorded.recorded_at
            view.state = ASSIGNED
    elif isinstance(event, TaskStarted):
        if event.allocation_id == view.allocation_id:
            view.agent_id = event.agent_id
            view.started_at = recorded.recorded_at
            view.state = RUNNING
    elif isinstance(event, TaskReady):
        if event.allocation_id == view.allocation_id and view.address is None:
            view.address = event.address
            view.port = event.port
            view.ready_at = recorded.recorded_at
    elif isinstance(event, TaskKillRequested):
        if not view.kill_requested:
            view.kill_reason = event.reason
        view.kill_requested = True
        view.kill_agents = sorted(set(view.kill_agents) | set(event.agent_ids))
    elif isinstance(event, TaskExited):
        view.outcome = event.outcome
        view.exit_code = event.exit_code
        view.message = event.message
        view.ended_at = recorded.recorded_at
        view.state = TERMINATED


def fold_task(task_id: str, events: Iterable[RecordedEvent]) -> TaskView:
    """Folds a task's stream (events of :data:`TASK_FACTS`; others only move ``version``)."""
    view = TaskView(task_id)
    for recorded in events:
        apply_task(view, recorded)
    return view
