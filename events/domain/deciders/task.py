"""Deciders of a task's stream: submit a command, a notebook, a TensorBoard or a shell, kill it,
and its agent's started/ready/idle/exited reports.

Pure: each reads a folded :class:`~events.domain.aggregates.task.TaskView` and a command and
returns the events to append or a :class:`~events.domain.deciders.Refusal`. A new task's id is a
field of its command (the API draws it), so deciding twice decides the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from events.domain.aggregates.task import TaskView
from events.domain.authorization import DEFAULT_WORKSPACE_ID
from events.domain.config.errors import join_path
from events.domain.config.task import TENSORBOARD_SLOTS, TaskConfig
from events.domain.deciders import Decision, conflict, invalid, not_found
from events.domain.names import is_task_id
from events.domain.types import (
    TaskExited,
    TaskKillRequested,
    TaskReady,
    TaskRequested,
    TaskStarted,
)
from events.domain.types.task import TaskKind, TaskOutcome, TensorboardSource

MAX_ARGV_ITEMS = 1000
"""The most arguments a command may have."""

MAX_ARGV_CHARS = 64 * 1024
"""The most characters a command's arguments may have together."""


@dataclass(frozen=True)
class RunCommand:
    """Submit a command task: ``argv`` run in the uploaded context ``code_ref``."""

    task_id: str
    owner: str
    argv: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)
    code_ref: str | None = None
    workspace_id: int = DEFAULT_WORKSPACE_ID
    """The workspace it goes in (the caller resolved it and authorized the owner there)."""


@dataclass(frozen=True)
class StartNotebook:
    """Submit a notebook task: JupyterLab in the uploaded context ``code_ref`` (the agent builds
    its command line, since only the agent knows the port it serves on)."""

    task_id: str
    owner: str
    config: dict[str, Any] = field(default_factory=dict)
    code_ref: str | None = None
    workspace_id: int = DEFAULT_WORKSPACE_ID
    """The workspace it goes in (the caller resolved it and authorized the owner there)."""


MAX_TENSORBOARD_EXPERIMENTS = 100
"""The most experiments one TensorBoard shows."""

MAX_TENSORBOARD_TRIALS = 1000
"""The most trials one TensorBoard names one by one (an experiment's every trial counts as
none: it is named by the experiment)."""


@dataclass(frozen=True)
class StartTensorboard:
    """Submit a TensorBoard over the TensorBoard files of ``sources`` (the caller checked that
    ``owner`` may read each experiment and trial, and resolved each trial's experiment)."""

    task_id: str
    owner: str
    sources: tuple[TensorboardSource, ...]
    config: dict[str, Any] = field(default_factory=dict)
    workspace_id: int = DEFAULT_WORKSPACE_ID
    """The workspace it goes in (the caller resolved it and authorized the owner there)."""


@dataclass(frozen=True)
class StartShell:
    """Submit a shell task: a server of terminal sessions in the uploaded context ``code_ref``
    (the agent builds its command line, as for a notebook)."""

    task_id: str
    owner: str
    config: dict[str, Any] = field(default_factory=dict)
    code_ref: str | None = None
    workspace_id: int = DEFAULT_WORKSPACE_ID
    """The workspace it goes in (the caller resolved it and authorized the owner there)."""


SERVING_KINDS: frozenset[str] = frozenset({"notebook", "tensorboard", "shell"})
"""Task kinds that serve HTTP, reached through the API's proxy once ready."""

_SERVER_NAMES: dict[TaskKind, str] = {"notebook": "JupyterLab", "shell": "Shell"}
"""What a served task's default description calls its server."""


@dataclass(frozen=True)
class KillTask:
    """Kill a task (its owner, an admin or a role granting ``update_nsc`` in its workspace,
    checked by the caller)."""

    actor: str


@dataclass(frozen=True)
class ReportTaskStarted:
    """An agent launched the task's allocation ``allocation_id``."""

    allocation_id: str
    agent_id: str


@dataclass(frozen=True)
class ReportTaskReady:
    """The task's server on ``agent_id`` accepts connections at ``address``:``port``."""

    allocation_id: str
    agent_id: str
    address: str
    port: int


@dataclass(frozen=True)
class ReportTaskIdle:
    """The task's server on ``agent_id`` had no activity for ``idle_seconds``."""

    allocation_id: str
    agent_id: str
    idle_seconds: int


@dataclass(frozen=True)
class ReportTaskExited:
    """The task's process on ``agent_id`` ended with ``exit_code`` (``agent_shutdown``: the
    agent stopped it because the agent itself was shutting down)."""

    allocation_id: str
    agent_id: str
    exit_code: int
    message: str = ""
    agent_shutdown: bool = False


def decide_run_command(state: TaskView, command: RunCommand) -> Decision:
    """``TaskRequested`` for a new command task; refuses a bad config, argv or id."""
    if not is_task_id(command.task_id):
        return invalid(f"task id {command.task_id[:40]!r} is not 8-32 hex digits", "task_id")
    if state.exists:
        return conflict(f"task {command.task_id} exists already", "task_id")
    if not command.argv:
        return invalid("argv: give the command to run", "argv")
    if len(command.argv) > MAX_ARGV_ITEMS:
        return invalid(f"argv: at most {MAX_ARGV_ITEMS} arguments", "argv")
    if sum(len(a) for a in command.argv) > MAX_ARGV_CHARS:
        return invalid(f"argv: at most {MAX_ARGV_CHARS} characters in all", "argv")
    if any("\x00" in a for a in command.argv):
        return invalid("argv: an argument contains a NUL character", "argv")
    return _requested(
        state,
        kind="command",
        task_id=command.task_id,
        owner=command.owner,
        config=command.config,
        argv=list(command.argv),
        code_ref=command.code_ref,
        workspace_id=command.workspace_id,
    )


def decide_start_notebook(state: TaskView, command: StartNotebook) -> Decision:
    """``TaskRequested`` (kind ``notebook``) for a new notebook; refuses a bad config or id."""
    return _served(state, command, kind="notebook")


def decide_start_shell(state: TaskView, command: StartShell) -> Decision:
    """``TaskRequested`` (kind ``shell``) for a new shell; refuses a bad config or id."""
    return _served(state, command, kind="shell")


def _served(state: TaskView, command: StartNotebook | StartShell, *, kind: TaskKind) -> Decision:
    if not is_task_id(command.task_id):
        return invalid(f"task id {command.task_id[:40]!r} is not 8-32 hex digits", "task_id")
    return _requested(
        state,
        kind=kind,
        task_id=command.task_id,
        owner=command.owner,
        config=command.config,
        argv=[],
        code_ref=command.code_ref,
        workspace_id=command.workspace_id,
    )


def decide_start_tensorboard(state: TaskView, command: StartTensorboard) -> Decision:
    """``TaskRequested`` (kind ``tensorboard``, no slots unless its config asks for some) for a
    new TensorBoard; refuses a bad config or id, no source, too many, or one named twice."""
    if not is_task_id(command.task_id):
        return invalid(f"task id {command.task_id[:40]!r} is not 8-32 hex digits", "task_id")
    if not command.sources:
        return invalid("give at least one experiment or trial to show", "experiment_ids")
    if len(command.sources) > MAX_TENSORBOARD_EXPERIMENTS:
        return invalid(
            f"a TensorBoard shows at most {MAX_TENSORBOARD_EXPERIMENTS} experiments, "
            f"not {len(command.sources)}",
            "experiment_ids",
        )
    named = [t for s in command.sources for t in s.trial_ids or ()]
    if len(named) > MAX_TENSORBOARD_TRIALS:
        return invalid(
            f"a TensorBoard shows at most {MAX_TENSORBOARD_TRIALS} trials named one by one, "
            f"not {len(named)}",
            "trial_ids",
        )
    experiments = [s.experiment_id for s in command.sources]
    if len(set(experiments)) != len(experiments) or len(set(named)) != len(named):
        return invalid("an experiment or a trial is named twice", "experiment_ids")
    if any(s.trial_ids == [] for s in command.sources):
        return invalid("a source names no trial (omit trial_ids for every trial)", "trial_ids")
    config = dict(command.config)
    if config.get("idle_timeout") is not None:
        return invalid(
            "config.idle_timeout: a TensorBoard has no idle timeout (kill it when done)",
            "config.idle_timeout",
        )
    if config.get("work_dir") is not None:
        return invalid(
            "config.work_dir: a TensorBoard has no context directory to start in",
            "config.work_dir",
        )
    resources = config.get("resources")
    if resources is None:
        config["resources"] = {"slots": TENSORBOARD_SLOTS}
    elif isinstance(resources, dict) and "slots" not in resources:
        config["resources"] = {**resources, "slots": TENSORBOARD_SLOTS}
    return _requested(
        state,
        kind="tensorboard",
        task_id=command.task_id,
        owner=command.owner,
        config=config,
        argv=[],
        code_ref=None,
        default_description=tensorboard_description(command.sources),
        tensorboard_sources=list(command.sources),
        workspace_id=command.workspace_id,
    )


def tensorboard_description(sources: tuple[TensorboardSource, ...]) -> str:
    """``TensorBoard: experiment 3, 4; trial 17, 18`` (what it shows, at most 200 characters)."""
    whole = [str(s.experiment_id) for s in sources if s.trial_ids is None]
    trials = [str(t) for s in sources for t in s.trial_ids or ()]
    parts = []
    if whole:
        parts.append(("experiment " if len(whole) == 1 else "experiments ") + ", ".join(whole))
    if trials:
        parts.append(("trial " if len(trials) == 1 else "trials ") + ", ".join(trials))
    text = "TensorBoard: " + "; ".join(parts)
    return text if len(text) <= 200 else text[:199] + "…"


def _requested(
    state: TaskView,
    *,
    kind: TaskKind,
    task_id: str,
    owner: str,
    config: dict[str, Any],
    argv: list[str],
    code_ref: str | None,
    workspace_id: int,
    default_description: str | None = None,
    tensorboard_sources: list[TensorboardSource] | None = None,
) -> Decision:
    if state.exists:
        return conflict(f"task {task_id} exists already", "task_id")
    try:
        valid = TaskConfig.model_validate(config)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = join_path(["config", *error["loc"]])
        return invalid(f"{path}: {error['msg']}", path)
    if valid.work_dir is not None and code_ref is None:
        return invalid(
            f"config.work_dir: {valid.work_dir!r} is a directory of the context, and this "
            f"{kind} has none (give one with --context)",
            "config.work_dir",
        )
    default = default_description or (
        " ".join(argv)[:200] if argv else f"{_SERVER_NAMES.get(kind, kind)} ({task_id[:8]})"
    )
    return [
        TaskRequested(
            task_id=task_id,
            kind=kind,
            owner=owner,
            config=valid.model_dump(mode="json"),
            argv=argv,
            code_ref=code_ref,
            description=valid.description or default,
            tensorboard_sources=tensorboard_sources or [],
            workspace_id=workspace_id,
        )
    ]


def decide_kill_task(state: TaskView, command: KillTask) -> Decision:
    """``TaskKillRequested`` naming the agents running the task (none while it is queued: the
    scheduler cancels it); nothing for a task that ended or whose kill was sent already."""
    if not state.exists:
        return not_found(f"no task {state.task_id}")
    if state.ended:
        return []
    agents = sorted(state.placements) if state.allocated else []
    if state.kill_requested and set(agents) <= set(state.kill_agents):
        return []
    return [
        TaskKillRequested(
            task_id=state.task_id,
            reason=f"killed by {command.actor}",
            allocation_id=state.allocation_id if agents else None,
            agent_ids=agents,
        )
    ]


def _reporter(state: TaskView, allocation_id: str, agent_id: str) -> Decision | None:
    if not state.exists or state.allocation_id is None:
        return not_found(f"no allocation {allocation_id}")
    if allocation_id != state.allocation_id:
        return not_found(f"no allocation {allocation_id}")
    if agent_id not in state.placements:
        return conflict(f"agent {agent_id} holds no part of {allocation_id}", "agent_id")
    return None


def decide_task_started(state: TaskView, command: ReportTaskStarted) -> Decision:
    """``TaskStarted`` once; nothing for a repeat or a task that already ended."""
    refusal = _reporter(state, command.allocation_id, command.agent_id)
    if refusal is not None:
        return refusal
    if state.ended or state.started_at is not None:
        return []
    return [
        TaskStarted(
            task_id=state.task_id, allocation_id=command.allocation_id, agent_id=command.agent_id
        )
    ]


def decide_task_ready(state: TaskView, command: ReportTaskReady) -> Decision:
    """``TaskReady`` once, for a kind that serves HTTP; nothing for a repeat or an ended task."""
    refusal = _reporter(state, command.allocation_id, command.agent_id)
    if refusal is not None:
        return refusal
    if state.kind not in SERVING_KINDS:
        return conflict(f"a {state.kind} task serves nothing to be ready", "kind")
    if state.ended or state.address is not None:
        return []
    return [
        TaskReady(
            task_id=state.task_id,
            allocation_id=command.allocation_id,
            agent_id=command.agent_id,
            address=command.address,
            port=command.port,
        )
    ]


def decide_task_idle(state: TaskView, command: ReportTaskIdle) -> Decision:
    """``TaskKillRequested`` saying the task was idle past its ``idle_timeout``; nothing when
    it has none, is not idle long enough, ended, or a kill was asked for already."""
    refusal = _reporter(state, command.allocation_id, command.agent_id)
    if refusal is not None:
        return refusal
    timeout = state.config.idle_seconds
    if state.ended or state.kill_requested or timeout is None:
        return []
    if command.idle_seconds < timeout:
        return []
    agents = sorted(state.placements)
    return [
        TaskKillRequested(
            task_id=state.task_id,
            reason=f"idle for {command.idle_seconds}s (idle_timeout {state.config.idle_timeout}): "
            "no activity and no open connection",
            allocation_id=state.allocation_id,
            agent_ids=agents,
        )
    ]


def task_outcome(state: TaskView, exit_code: int, *, agent_shutdown: bool = False) -> TaskOutcome:
    """How a run that exited with ``exit_code`` ended: ``killed`` when a kill was asked for
    (and it exited non-zero, or it is a server),
    ``lost`` when its agent stopped it while shutting down (the platform ended it, not the
    command), else ``completed`` (0) or ``failed``."""
    if state.kill_requested and (exit_code != 0 or state.kind in SERVING_KINDS):
        return "killed"  # a server (a notebook, a shell) exits 0 when stopped: it never completes
    if agent_shutdown:
        return "lost"
    return "completed" if exit_code == 0 else "failed"


def decide_task_exited(state: TaskView, command: ReportTaskExited) -> Decision:
    """``TaskExited`` with the exit code; nothing when the task ended already (e.g. lost)."""
    refusal = _reporter(state, command.allocation_id, command.agent_id)
    if refusal is not None:
        return refusal
    if state.ended:
        return []
    outcome = task_outcome(state, command.exit_code, agent_shutdown=command.agent_shutdown)
    message = state.kill_reason if outcome == "killed" and state.kill_reason else command.message
    return [
        TaskExited(
            task_id=state.task_id,
            allocation_id=command.allocation_id,
            outcome=outcome,
            exit_code=command.exit_code,
            message=message[:2000],
        )
    ]
