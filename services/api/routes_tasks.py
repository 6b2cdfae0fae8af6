"""Tasks for users: submit a command, a notebook or a shell, list, describe, kill, read its logs
(a TensorBoard is submitted by :mod:`services.api.routes_tensorboards`).

A task lives in a workspace (``workspace`` in the submission: its id or name; the default
workspace when none). Every route parses, authorizes by the roles' rule
(:func:`services.api.access.check_task`: the owner and admins may do everything, others what a
role grants in the task's workspace, 403 otherwise), folds the task's stream and calls its
decider (:mod:`events.domain.deciders.task`); the scheduler places a queued task and the agent
reports its start and exit (:mod:`services.api.task_runs`). The list folds every task's stream
from the log (there is no projection of tasks yet) and shows the tasks the caller may see.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import structlog
from aiohttp import web
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from events.domain.aggregates import TASK_FACTS, TaskView, apply_task, fold_task
from events.domain.aggregates.common import iso
from events.domain.aggregates.teams import Teams
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
from events.domain.types.teams import MAX_NAME
from events.log.store import EventStore, Transaction
from services.api import tables
from services.api.access import check_task
from services.api.auth import principal_of
from services.api.decided import accepted, append_decided
from services.api.errors import ApiError, bad_request, not_found, parse, read_json
from services.api.host_access import check_host_requests
from services.api.inbox import in_transaction
from services.api.limits import EXPERIMENT_MAX_BODY
from services.api.routes_experiment_submit import code_ref_of, decode_code, store_code
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import allows, authorize, check_pool, current_teams
from services.api.views import Reader, read_facts

log = structlog.get_logger("api")
routes = RouteTable("tasks")

MAX_LOG_LINES = 10_000


def _one_workspace_ref(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        raise ValueError(
            f"give the workspace's id (an integer) or its name (a string of at most "
            f"{MAX_NAME} characters), not {str(value)[:40]!r}"
        ) from None


WorkspaceRef = Annotated[
    StrictInt | Annotated[StrictStr, Field(max_length=MAX_NAME * 4)],
    WrapValidator(_one_workspace_ref),
]
"""A workspace as a submission names it: its id, or its name (a name of digits only is read as
an id, as in a path)."""

WORKSPACE_FIELD = Field(
    None, description="the workspace the task goes in: its id or name (none: the default one)"
)


class CreateCommandBody(BaseModel):
    """A command to run: ``argv``, its ``config`` (Determined's command config: ``description``,
    ``resources.slots``/``priority``/``resource_pool``, ``environment.environment_variables``,
    ``bind_mounts``, ``work_dir``) and its context directory as a base64 tar.gz (``code``)."""

    model_config = ConfigDict(extra="forbid")

    argv: list[str] = Field(min_length=1, max_length=MAX_ARGV_ITEMS)
    config: dict[str, Any] = Field(default_factory=dict)
    code: str | None = None
    workspace: WorkspaceRef | None = WORKSPACE_FIELD


class CreateNotebookBody(BaseModel):
    """A notebook to start: its ``config`` (the command config's fields and ``idle_timeout``)
    and its context directory as a base64 tar.gz (``code``), its work directory."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(default_factory=dict)
    code: str | None = None
    workspace: WorkspaceRef | None = WORKSPACE_FIELD


class CreateShellBody(CreateNotebookBody):
    """A shell to start: its ``config`` (the command config's fields and ``idle_timeout``) and
    its context directory as a base64 tar.gz (``code``), where its shells start."""


class TaskDetail(BaseModel):
    """A task as the CLI shows it."""

    id: str
    kind: str
    owner: str
    workspace_id: int
    workspace: str
    """The workspace's name (``""`` for one deleted since)."""
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


class TasksQuery(BaseModel):
    """Only the tasks of workspace ``workspace_id``, when given."""

    workspace_id: int | None = Field(None, ge=1, le=2**62, description="only this workspace's")


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


def describe(task: TaskView, teams: Teams) -> dict[str, Any]:
    """A folded task as :class:`TaskDetail` (``teams``: to name its workspace)."""
    workspace = teams.workspaces.get(task.workspace_id)
    return {
        "id": task.task_id,
        "kind": task.kind,
        "owner": task.owner,
        "workspace_id": task.workspace_id,
        "workspace": workspace.name if workspace else "",
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
    store = store_of(request)
    task = await load_task(store, request.match_info["task_id"])
    await check_task(store, principal_of(request), task)
    return task


async def fold_tasks(store: EventStore) -> list[TaskView]:
    """Every task folded from the log, oldest first."""
    tasks: dict[str, TaskView] = {}
    async for recorded in store.iter_all(0, types=TASK_FACTS):
        task_id = task_of_stream(recorded.stream_id)
        if task_id is None:
            continue
        apply_task(tasks.setdefault(task_id, TaskView(task_id)), recorded)
    return sorted((t for t in tasks.values() if t.exists), key=lambda t: t.requested_position)


async def live_tasks_in(store: EventStore, workspace_id: int) -> list[TaskView]:
    """The tasks of workspace ``workspace_id`` that have not ended, oldest first."""
    return [t for t in await fold_tasks(store) if t.workspace_id == workspace_id and not t.ended]


def task_workspace(teams: Teams, ref: int | str | None) -> int:
    """The id of the workspace a new task goes in: ``ref`` (its id, or its name; a name of
    digits only is read as an id), the default workspace for ``None``.

    Raises:
        ApiError: 400 naming ``workspace`` when there is no such workspace.
    """
    if ref is None:
        return DEFAULT_WORKSPACE_ID
    if isinstance(ref, int):
        found = teams.workspaces.get(ref)
    elif ref.isascii() and ref.isdigit():
        found = teams.workspaces.get(int(ref))
    else:
        found = teams.workspace_named(ref)
    if found is None:
        raise bad_request(f"workspace: no workspace {str(ref)[:100]!r}", path="workspace")
    return found.workspace_id


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
    workspace_id = task_workspace(await current_teams(store_of(request)), body.workspace)
    code = decode_code(request, body.code)
    command = RunCommand(
        task_id=new_task_id(),
        owner=principal.name,
        argv=tuple(body.argv),
        config=body.config,
        code_ref=code_ref_of(code),
        workspace_id=workspace_id,
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
    workspace_id = task_workspace(await current_teams(store_of(request)), body.workspace)
    code = decode_code(request, body.code)
    command = StartNotebook(
        task_id=new_task_id(),
        owner=principal.name,
        config=body.config,
        code_ref=code_ref_of(code),
        workspace_id=workspace_id,
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
    workspace_id = task_workspace(await current_teams(store_of(request)), body.workspace)
    code = decode_code(request, body.code)
    command = StartShell(
        task_id=new_task_id(),
        owner=principal.name,
        config=body.config,
        code_ref=code_ref_of(code),
        workspace_id=workspace_id,
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
    refusal is raised as its 4xx) and answers the task as it now stands. The caller must be
    allowed to start tasks in the task's workspace (403), which must not be archived (409); a
    pool bound away from it is refused (400 naming ``resources.resource_pool``), as is a bind
    mount the cluster does not allow (400 naming ``bind_mounts[i].host_path``, as for an
    experiment)."""
    principal = principal_of(request)
    events = accepted(decision)
    teams = await current_teams(store_of(request))
    for event in events:
        if isinstance(event, TaskRequested):
            authorize(
                teams, principal, Permission.CREATE_TASKS, workspace_id=event.workspace_id,
                what="starting a task",
            )  # fmt: skip
            workspace = teams.workspaces.get(event.workspace_id)
            if workspace is None:
                raise bad_request(f"workspace: no workspace {event.workspace_id}", "workspace")
            if workspace.archived:
                raise ApiError(
                    409, f"workspace {workspace.name!r} is archived: it takes no new task"
                )
            pool = TaskConfig.model_validate(event.config).resources.resource_pool
            check_pool(teams, pool, event.workspace_id)
            check_host_requests(request, event.config)

    async def work(tx: Transaction) -> dict[str, Any]:
        view = TaskView(task_id)
        await store_code(tx, code_ref_of(code), code)
        recorded = await append_decided(
            tx, task_stream(task_id), events, expected_version=0, actor=principal.name
        )
        for event in recorded:
            apply_task(view, event)
        return describe(view, teams)

    result = await in_transaction(store_of(request), work)
    log.info("task submitted", task_id=task_id, kind=result["kind"], owner=principal.name)
    return web.json_response(result)


@routes.get("/api/v1/tasks", allow=USERS, query=TasksQuery, response=TasksResponse)
async def list_tasks(request: web.Request) -> web.Response:
    """The tasks the caller may see (their own, those of the workspaces where a role lets them
    see tasks; an admin's: everyone's), of one workspace with ``workspace_id``, oldest first."""
    principal = principal_of(request)
    query = parse(TasksQuery, dict(request.query))
    store = store_of(request)
    teams = await current_teams(store)
    visible = [
        describe(t, teams)
        for t in await fold_tasks(store)
        if (query.workspace_id is None or t.workspace_id == query.workspace_id)
        and (
            t.owner == principal.name
            or allows(teams, principal, Permission.VIEW_TASKS, workspace_id=t.workspace_id)
        )
    ]
    return web.json_response({"tasks": visible})


@routes.get("/api/v1/tasks/{task_id}", allow=USERS, response=TaskDetail)
async def get_task(request: web.Request) -> web.Response:
    """One task folded from its stream (its owner, an admin, or ``view_nsc`` in its
    workspace)."""
    task = await _visible_task(request)
    return web.json_response(describe(task, await current_teams(store_of(request))))


@routes.post(
    "/api/v1/tasks/{task_id}/kill", allow=USERS, body=KillTaskBody, response=KillTaskResponse
)
async def kill_task(request: web.Request) -> web.Response:
    """Appends TaskKillRequested: a running task's agent kills it, a queued one is canceled
    (its owner, an admin, or ``update_nsc`` in its workspace; nothing for a task that
    ended)."""
    principal = principal_of(request)
    task_id = request.match_info["task_id"]
    parse(KillTaskBody, await read_json(request))

    async def work(tx: Transaction) -> dict[str, Any]:
        task = await load_task(tx, task_id)
        await check_task(tx, principal, task, Permission.UPDATE_TASKS)
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
