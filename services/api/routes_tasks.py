"""Tasks for users: submit a command, a notebook or a shell, list, describe, kill, read its logs
(a TensorBoard is submitted by :mod:`services.api.routes_tensorboards`).

Every route parses, authorizes (a task is its owner's: another user gets 403, admins see all),
folds the task's stream and calls its decider (:mod:`events.domain.deciders.task`); the
scheduler places a queued task and the agent reports its start and exit
(:mod:`services.api.task_runs`). The list folds every task's stream from the log (there is no
projection of tasks yet).
"""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from events.domain.aggregates import TASK_FACTS, TaskView, apply_task, fold_task
from events.domain.aggregates.common import iso
from events.domain.authorization import DEFAULT_WORKSPACE_ID, Permission
from events.domain.config.task import TaskConfig
from events.domain.deciders import Decision
from events.domain.deciders.task import (
    MAX_ARGV_ITEMS,
    SERVING_KINDS,
    KillTask,
    RunCommand,
    StartNotebook,
    StartShell,
    decide_kill_task,
    decide_run_command,
    decide_start_notebook,
    decide_start_shell,
)
from events.domain.names import is_task_id, task_of_stream, task_stream
from events.domain.types import TaskRequested
from events.log.store import Transaction
from services.api import tables
from services.api.auth import Principal, principal_of
from services.api.decided import accepted, append_decided
from services.api.errors import forbidden, not_found, parse, read_json
from services.api.host_access import check_host_requests
from services.api.inbox import in_transaction
from services.api.limits import EXPERIMENT_MAX_BODY
from services.api.routes_experiment_submit import code_ref_of, decode_code, store_code
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import authorize, check_pool, current_teams
from services.api.views import Reader, read_facts

log = structlog.get_logger("api")
routes = RouteTable("tasks")

MAX_LOG_LINES = 10_000


class CreateCommandBody(BaseModel):
    """A command to run: ``argv``, its ``config`` (Determined's command config: ``description``,
    ``resources.slots``/``priority``/``resource_pool``, ``environment.environment_variables``,
    ``bind_mounts``, ``work_dir``) and its context directory as a base64 tar.gz (``code``)."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] = Field(min_length=1, max_length=MAX_ARGV_ITEMS)
    config: dict[str, Any] = Field(default_factory=dict)
    code: str | None = None


class CreateNotebookBody(BaseModel):
    """A notebook to start: its ``config`` (the command config's fields and ``idle_timeout``)
    and its context directory as a base64 tar.gz (``code``), its work directory."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(default_factory=dict)
    code: str | None = None


class CreateShellBody(CreateNotebookBody):
    """A shell to start: its ``config`` (the command config's fields and ``idle_timeout``) and
    its context directory as a base64 tar.gz (``code``), where its shells start."""


class TaskDetail(BaseModel):
    """A task as the CLI shows it."""

    id: str
    kind: str
    owner: str
    description: str
    state: str
    argv: list[str]
    config: dict[str, Any]
    code_ref: str | None
    tensorboard_sources: list[dict[str, Any]]
    """What a TensorBoard shows: ``experiment_id``, ``trial_ids`` (``null``: every trial),
    ``storage`` (credentials masked); empty for other kinds."""
    allocation_id: str | None
    agent_id: str | None
    ready: bool
    proxy_path: str | None
    kill_requested: bool
    outcome: str | None
    exit_code: int | None
    message: str
    requested_at: str | None
    started_at: str | None
    ended_at: str | None


class TasksResponse(BaseModel):
    """Tasks, oldest first."""

    tasks: list[TaskDetail]


class TaskLogsQuery(BaseModel):
    """Lines after ``after_id``, at most ``limit``."""

    after_id: int = Field(0, ge=0, le=2**62)
    limit: int = Field(1000, ge=1, le=MAX_LOG_LINES)


class TaskLogLine(BaseModel):
    """One line of the task's output."""

    id: int
    stream: str
    ts: str
    line: str


class TaskLogsResponse(BaseModel):
    """A page of lines; ``done`` once the task ended and no line is left after these."""

    logs: list[TaskLogLine]
    next_after_id: int
    done: bool


class KillTaskBody(BaseModel):
    """No fields."""

    model_config = ConfigDict(extra="forbid")


class KillTaskResponse(BaseModel):
    """The task's state when the kill was asked for, and whether an event was appended."""

    id: str
    state: str
    changed: bool


def describe(task: TaskView) -> dict[str, Any]:
    """A folded task as :class:`TaskDetail`."""
    return {
        "id": task.task_id,
        "kind": task.kind,
        "owner": task.owner,
        "description": task.description,
        "state": task.state,
        "argv": task.argv,
        "config": task.config.model_dump(mode="json"),
        "code_ref": task.code_ref,
        "tensorboard_sources": [s.model_dump(mode="json") for s in task.tensorboard_sources],
        "allocation_id": task.allocation_id,
        "agent_id": task.agent_id,
        "ready": task.ready,
        "proxy_path": f"/proxy/{task.task_id}/" if task.kind in SERVING_KINDS else None,
        "kill_requested": task.kill_requested,
        "outcome": task.outcome,
        "exit_code": task.exit_code,
        "message": task.message,
        "requested_at": iso(task.requested_at),
        "started_at": iso(task.started_at),
        "ended_at": iso(task.ended_at),
    }


def check_task_owner(principal: Principal, task: TaskView) -> None:
    """Raises 403 unless ``principal`` is an admin or the task's owner."""
    if not (principal.is_admin or (principal.kind == "user" and principal.name == task.owner)):
        raise forbidden("only the task's owner or an admin may do this")


async def load_task(reader: Reader, task_id: str) -> TaskView:
    """The task folded from its stream; 404 when there is none."""
    if not is_task_id(task_id):
        raise not_found(f"no task {task_id[:40]!r} (task ids are 8-32 hex digits)")
    events, head = await read_facts(reader, task_stream(task_id), TASK_FACTS)
    view = fold_task(task_id, events)
    view.version = head
    if not view.exists:
        raise not_found(f"no task {task_id}")
    return view


async def _visible_task(request: web.Request) -> TaskView:
    task = await load_task(store_of(request), request.match_info["task_id"])
    check_task_owner(principal_of(request), task)
    return task


@routes.post(
    "/api/v1/commands",
    allow=USERS,
    body=CreateCommandBody,
    response=TaskDetail,
    max_body=EXPERIMENT_MAX_BODY,
)
async def create_command(request: web.Request) -> web.Response:
    """Stores the context content-addressed and appends TaskRequested (kind ``command``)."""
    principal = principal_of(request)
    body = parse(CreateCommandBody, await read_json(request))
    code = decode_code(request, body.code)
    command = RunCommand(
        task_id=new_task_id(),
        owner=principal.name,
        argv=tuple(body.argv),
        config=body.config,
        code_ref=code_ref_of(code),
    )
    return await submit_decided(
        request, command.task_id, code, decide_run_command(TaskView(command.task_id), command)
    )


@routes.post(
    "/api/v1/notebooks",
    allow=USERS,
    body=CreateNotebookBody,
    response=TaskDetail,
    max_body=EXPERIMENT_MAX_BODY,
)
async def create_notebook(request: web.Request) -> web.Response:
    """Stores the context content-addressed and appends TaskRequested (kind ``notebook``)."""
    principal = principal_of(request)
    body = parse(CreateNotebookBody, await read_json(request))
    code = decode_code(request, body.code)
    command = StartNotebook(
        task_id=new_task_id(), owner=principal.name, config=body.config, code_ref=code_ref_of(code)
    )
    return await submit_decided(
        request, command.task_id, code, decide_start_notebook(TaskView(command.task_id), command)
    )


@routes.post(
    "/api/v1/shells",
    allow=USERS,
    body=CreateShellBody,
    response=TaskDetail,
    max_body=EXPERIMENT_MAX_BODY,
)
async def create_shell(request: web.Request) -> web.Response:
    """Stores the context content-addressed and appends TaskRequested (kind ``shell``)."""
    principal = principal_of(request)
    body = parse(CreateShellBody, await read_json(request))
    code = decode_code(request, body.code)
    command = StartShell(
        task_id=new_task_id(), owner=principal.name, config=body.config, code_ref=code_ref_of(code)
    )
    return await submit_decided(
        request, command.task_id, code, decide_start_shell(TaskView(command.task_id), command)
    )


def new_task_id() -> str:
    """A new task's id: 16 random hex digits."""
    return uuid.uuid4().hex[:16]


async def submit_decided(
    request: web.Request, task_id: str, code: bytes | None, decision: Decision
) -> web.Response:
    """Appends a new task's decided ``TaskRequested`` with its context stored beside it (a
    refusal is raised as its 4xx) and answers the task as it now stands. Tasks live in the
    default workspace: the caller must be allowed to start tasks there, and a pool bound away
    from it is refused (400 naming ``resources.resource_pool``), as is a bind mount the cluster
    does not allow (400 naming ``bind_mounts[i].host_path``, as for an experiment)."""
    principal = principal_of(request)
    events = accepted(decision)
    teams = await current_teams(store_of(request))
    authorize(
        teams, principal, Permission.CREATE_TASKS, workspace_id=DEFAULT_WORKSPACE_ID,
        what="starting a task",
    )  # fmt: skip
    for event in events:
        if isinstance(event, TaskRequested):
            pool = TaskConfig.model_validate(event.config).resources.resource_pool
            check_pool(teams, pool, DEFAULT_WORKSPACE_ID)
            check_host_requests(request, event.config)

    async def work(tx: Transaction) -> dict[str, Any]:
        view = TaskView(task_id)
        await store_code(tx, code_ref_of(code), code)
        recorded = await append_decided(
            tx, task_stream(task_id), events, expected_version=0, actor=principal.name
        )
        for event in recorded:
            apply_task(view, event)
        return describe(view)

    result = await in_transaction(store_of(request), work)
    log.info("task submitted", task_id=task_id, kind=result["kind"], owner=principal.name)
    return web.json_response(result)


@routes.get("/api/v1/tasks", allow=USERS, response=TasksResponse)
async def list_tasks(request: web.Request) -> web.Response:
    """The caller's tasks (an admin's: everyone's), oldest first."""
    principal = principal_of(request)
    store = store_of(request)
    tasks: dict[str, TaskView] = {}
    async for recorded in store.iter_all(0, types=TASK_FACTS):
        task_id = task_of_stream(recorded.stream_id)
        if task_id is None:
            continue
        apply_task(tasks.setdefault(task_id, TaskView(task_id)), recorded)
    visible = [
        describe(t)
        for t in sorted(tasks.values(), key=lambda t: t.requested_position)
        if t.exists and (principal.is_admin or t.owner == principal.name)
    ]
    return web.json_response({"tasks": visible})


@routes.get("/api/v1/tasks/{task_id}", allow=USERS, response=TaskDetail)
async def get_task(request: web.Request) -> web.Response:
    """One task folded from its stream (owner or admin)."""
    return web.json_response(describe(await _visible_task(request)))


@routes.post(
    "/api/v1/tasks/{task_id}/kill", allow=USERS, body=KillTaskBody, response=KillTaskResponse
)
async def kill_task(request: web.Request) -> web.Response:
    """Appends TaskKillRequested: a running task's agent kills it, a queued one is canceled
    (owner or admin; nothing for a task that ended)."""
    principal = principal_of(request)
    task_id = request.match_info["task_id"]
    parse(KillTaskBody, await read_json(request))

    async def work(tx: Transaction) -> dict[str, Any]:
        task = await load_task(tx, task_id)
        check_task_owner(principal, task)
        events = accepted(decide_kill_task(task, KillTask(actor=principal.name)))
        await append_decided(
            tx, task_stream(task_id), events, expected_version=task.version, actor=principal.name
        )
        return {"id": task_id, "state": task.state, "changed": bool(events)}

    result = await in_transaction(store_of(request), work)
    if result["changed"]:
        log.info("task kill requested", task_id=task_id, actor=principal.name)
    return web.json_response(result)


@routes.get(
    "/api/v1/tasks/{task_id}/logs", allow=USERS, query=TaskLogsQuery, response=TaskLogsResponse
)
async def task_logs(request: web.Request) -> web.Response:
    """The task's output lines (table ``task_logs``, rows of its ``task_id``) after
    ``after_id``; ``done`` once it ended and every line was read."""
    query = parse(TaskLogsQuery, dict(request.query))
    task = await _visible_task(request)
    store = store_of(request)
    rows = await tables.fetch(
        store,
        """SELECT id, stream, ts, line FROM task_logs
           WHERE task_id = $1 AND id > $2 ORDER BY id ASC LIMIT $3""",
        task.task_id,
        query.after_id,
        query.limit,
    )
    lines = [
        {"id": r["id"], "stream": r["stream"], "ts": r["ts"].isoformat(), "line": r["line"]}
        for r in rows
    ]
    next_after_id = lines[-1]["id"] if lines else query.after_id
    done = task.ended and len(lines) < query.limit
    return web.json_response({"logs": lines, "next_after_id": next_after_id, "done": done})
