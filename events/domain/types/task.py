"""Facts on a task's stream (``task-<id>``, see :mod:`events.domain.names`).

A task is interactive or one-off work on the cluster that is not a trial: a ``command``
(Determined's ``det cmd run``), a ``notebook`` (JupyterLab, reached through the API's proxy), a
``tensorboard`` (TensorBoard over the event files of some experiments' trials, reached the same
way) or a ``shell`` (a terminal on a pty, reached the same way). A kind that serves HTTP records
``TaskReady`` with the address its agent bound once it accepts connections. A task runs at most
once: it is never preempted and never restarted, so its stream holds one request, at most one
allocation and one exit.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from events.domain.authorization import DEFAULT_WORKSPACE_ID
from events.log.envelope import Event
from events.log.registry import register, upcaster

TaskKind = Literal["command", "notebook", "tensorboard", "shell"]
"""What a task runs. A new value needs no new schema version: every stored payload stays
valid."""

TaskOutcome = Literal["completed", "failed", "killed", "canceled", "lost"]
"""How a task ended: its process exited 0 (``completed``) or not (``failed``), it was killed
while running, canceled before it ran, or its agent lost it."""


class TensorboardSource(BaseModel):
    """One experiment whose TensorBoard files a ``tensorboard`` task shows.

    ``trial_ids`` are the trials it shows (``None``: every trial the experiment has or will
    have); ``storage`` is the experiment's ``checkpoint_storage`` when the task was requested,
    its credentials masked (``None``: the cluster's default storage). The agent gets the
    credentials from the experiment's config, as a trial of it does; they are never copied
    into a task's request.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment_id: int = Field(ge=1)
    trial_ids: list[int] | None = None
    storage: dict[str, Any] | None = None


@register
class TaskRequested(Event):
    """A user submitted a task: what to run (``argv`` in the uploaded context ``code_ref``),
    with which validated config (:class:`events.domain.config.task.TaskConfig`).

    A ``tensorboard`` names the experiments and trials it shows in ``tensorboard_sources``,
    decided (and their reading authorized) when it was requested (version 2; a version 1
    payload is of a command or a notebook, which have none).

    ``workspace_id`` is the workspace the task lives in, whose roles decide who else may see,
    kill or open it (version 3; before, every task was in the default workspace, 1).
    """

    event_type = "TaskRequested"
    schema_version = 3

    task_id: str
    kind: TaskKind
    owner: str
    config: dict[str, Any] = Field(default_factory=dict)
    argv: list[str]
    code_ref: str | None = None
    description: str = ""
    tensorboard_sources: list[TensorboardSource] = Field(default_factory=list)
    workspace_id: int = Field(ge=1)


@upcaster("TaskRequested", 1)
def _task_requested_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "tensorboard_sources": []}


@upcaster("TaskRequested", 2)
def _task_requested_v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "workspace_id": DEFAULT_WORKSPACE_ID}


@register
class TaskAllocated(Event):
    """The scheduler placed the task: its slots on one agent (none for a zero-slot task)."""

    event_type = "TaskAllocated"
    schema_version = 1

    task_id: str
    allocation_id: str
    placements: dict[str, list[str]] = Field(description="agent id -> slot ids")
    run_id: int = 1


@register
class TaskStarted(Event):
    """An agent launched the task's process."""

    event_type = "TaskStarted"
    schema_version = 1

    task_id: str
    allocation_id: str
    agent_id: str


@register
class TaskReady(Event):
    """The task's server accepts connections at ``address``:``port`` on its agent (the only
    place the API's proxy forwards its traffic to)."""

    event_type = "TaskReady"
    schema_version = 1

    task_id: str
    allocation_id: str
    agent_id: str
    address: str
    port: int = Field(ge=1, le=65535)


@register
class TaskKillRequested(Event):
    """The owner (or an admin, or a user whose role in the task's workspace allows it) asked
    to kill the task; ``agent_ids`` are the agents running it (none when it was not allocated
    yet: the scheduler then cancels it)."""

    event_type = "TaskKillRequested"
    schema_version = 1

    task_id: str
    reason: str
    allocation_id: str | None = None
    agent_ids: list[str] = Field(default_factory=list)


@register
class TaskExited(Event):
    """The task ended; its slots (if it held any) are free again."""

    event_type = "TaskExited"
    schema_version = 1

    task_id: str
    allocation_id: str | None = None
    outcome: TaskOutcome
    exit_code: int | None = None
    message: str = ""
