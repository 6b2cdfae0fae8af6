"""Workspaces and projects: list, describe, create, rename or edit, archive, delete; and moving
an experiment between projects (decided by :mod:`events.domain.deciders.teams`).

A workspace or project in a path is its id, or its name (a name of digits only is read as an
id). Who may do what is :func:`events.domain.authorization.permitted`'s answer; a user sees the
workspaces where some role lets them see it (everyone sees the default one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates.teams import Project, Teams, Workspace
from events.domain.authorization import Permission
from events.domain.deciders import Decision
from events.domain.deciders.experiment import MoveExperiment, decide_move
from events.domain.deciders.teams import (
    ArchiveProject,
    ArchiveWorkspace,
    CreateProject,
    CreateWorkspace,
    DeleteProject,
    DeleteWorkspace,
    EditProject,
    RenameWorkspace,
    decide_project,
    decide_workspace,
)
from events.domain.types.teams import MAX_NAME
from events.log.store import Transaction
from services.api import projections_read as pr
from services.api.auth import Principal, principal_of
from services.api.errors import ApiError, parse, read_json
from services.api.experiment_commands import act_on_experiment, experiment_id_of
from services.api.model_views import models_by_workspace
from services.api.routes_tasks import live_tasks_in
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import (
    allows,
    authorize,
    check_pool,
    current_teams,
    decide_teams,
    project_by_ref,
    workspace_by_ref,
)
from services.api.views import load_experiment
from services.tracker import read as tracker_read

log = structlog.get_logger("api")
routes = RouteTable("workspaces")


class WorkspaceOut(BaseModel):
    """A workspace."""

    id: int
    name: str
    owner: str
    archived: bool
    immutable: bool
    num_projects: int
    created_at: str | None


class ProjectOut(BaseModel):
    """A project (``archived``: its own flag or its workspace's)."""

    id: int
    name: str
    workspace_id: int
    workspace: str
    description: str
    owner: str
    archived: bool
    immutable: bool
    created_at: str | None


class WorkspacesResponse(BaseModel):
    """The workspaces the caller may see, by id."""

    workspaces: list[WorkspaceOut]


class ProjectsResponse(BaseModel):
    """A workspace's projects, by id."""

    projects: list[ProjectOut]


class WorkspaceBody(BaseModel):
    """A workspace's name."""

    model_config = {"extra": "forbid"}

    name: str = Field(max_length=MAX_NAME * 4)


class ProjectBody(BaseModel):
    """A new project."""

    model_config = {"extra": "forbid"}

    name: str = Field(max_length=MAX_NAME * 4)
    description: str = Field("", max_length=10_000)


class ProjectPatch(BaseModel):
    """A project's new name or description (absent: kept)."""

    model_config = {"extra": "forbid"}

    name: str | None = Field(None, max_length=MAX_NAME * 4)
    description: str | None = Field(None, max_length=10_000)


class MoveBody(BaseModel):
    """Where an experiment goes."""

    model_config = {"extra": "forbid"}

    destination_project_id: int = Field(ge=1)


class MoveResponse(BaseModel):
    """The experiment's project now, and whether it moved."""

    id: int
    project_id: int
    moved: bool


class EmptyBody(BaseModel):
    """No fields."""

    model_config = {"extra": "forbid"}


class DeletedResponse(BaseModel):
    """What was deleted."""

    id: int
    deleted: bool


def describe_workspace(teams: Teams, workspace: Workspace) -> dict[str, Any]:
    """A workspace as the API shows it."""
    return {
        "id": workspace.workspace_id,
        "name": workspace.name,
        "owner": workspace.owner,
        "archived": workspace.archived,
        "immutable": workspace.immutable,
        "num_projects": len(teams.projects_of(workspace.workspace_id)),
        "created_at": workspace.created_at.isoformat() if workspace.created_at else None,
    }


def describe_project(teams: Teams, project: Project) -> dict[str, Any]:
    """A project as the API shows it."""
    workspace = teams.workspaces.get(project.workspace_id)
    return {
        "id": project.project_id,
        "name": project.name,
        "workspace_id": project.workspace_id,
        "workspace": workspace.name if workspace else "",
        "description": project.description,
        "owner": project.owner,
        "archived": teams.project_archived(project.project_id),
        "immutable": project.immutable,
        "created_at": project.created_at.isoformat() if project.created_at else None,
    }


def _visible_workspace(teams: Teams, principal: Principal, ref: str) -> Workspace:
    """The workspace of ``ref`` if the caller may see it (404 otherwise: a workspace the caller
    cannot see is not shown to exist)."""
    workspace = workspace_by_ref(teams, ref)
    if not allows(teams, principal, Permission.VIEW_WORKSPACE, workspace_id=workspace.workspace_id):
        raise ApiError(404, f"no workspace {ref[:100]!r}")
    return workspace


def _visible_project(teams: Teams, principal: Principal, ref: str) -> Project:
    project = project_by_ref(teams, ref)
    if not allows(teams, principal, Permission.VIEW_PROJECT, workspace_id=project.workspace_id):
        raise ApiError(404, f"no project {ref[:100]!r}")
    return project


# --- workspaces --------------------------------------------------------------------------


@routes.get("/api/v1/workspaces", allow=USERS, response=WorkspacesResponse)
async def list_workspaces(request: web.Request) -> web.Response:
    """The workspaces the caller may see, by id."""
    principal = principal_of(request)
    teams = await current_teams(store_of(request))
    shown = [
        describe_workspace(teams, w)
        for _, w in sorted(teams.workspaces.items())
        if allows(teams, principal, Permission.VIEW_WORKSPACE, workspace_id=w.workspace_id)
    ]
    return web.json_response({"workspaces": shown})


@routes.post("/api/v1/workspaces", allow=USERS, body=WorkspaceBody, response=WorkspaceOut)
async def create_workspace(request: web.Request) -> web.Response:
    """Creates a workspace (admins and WorkspaceCreators); its creator administers it."""
    body = parse(WorkspaceBody, await read_json(request))

    def act(teams: Teams, principal: Principal) -> Decision:
        authorize(teams, principal, Permission.CREATE_WORKSPACE, what="creating a workspace")
        return decide_workspace(teams, CreateWorkspace(name=body.name, actor=principal.name))

    await decide_teams(request, act)
    teams = await current_teams(store_of(request))
    workspace = teams.workspace_named(body.name)
    assert workspace is not None
    log.info("workspace created", workspace_id=workspace.workspace_id)
    return web.json_response(describe_workspace(teams, workspace))


@routes.get("/api/v1/workspaces/{workspace}", allow=USERS, response=WorkspaceOut)
async def get_workspace(request: web.Request) -> web.Response:
    """One workspace (404 when unknown or not visible to the caller)."""
    teams = await current_teams(store_of(request))
    workspace = _visible_workspace(teams, principal_of(request), request.match_info["workspace"])
    return web.json_response(describe_workspace(teams, workspace))


def _workspace_change(
    request: web.Request, make: Callable[[Workspace], Any], permission: Permission
) -> Callable[[Teams, Principal], Decision]:
    ref = request.match_info["workspace"]

    def act(teams: Teams, principal: Principal) -> Decision:
        workspace = _visible_workspace(teams, principal, ref)
        authorize(teams, principal, permission, workspace_id=workspace.workspace_id)
        return decide_workspace(teams, make(workspace))

    return act


async def _workspace_answer(request: web.Request, workspace_id: int) -> web.Response:
    teams = await current_teams(store_of(request))
    return web.json_response(describe_workspace(teams, teams.workspaces[workspace_id]))


@routes.add(
    "PATCH", "/api/v1/workspaces/{workspace}", allow=USERS, body=WorkspaceBody,
    response=WorkspaceOut,
)  # fmt: skip
async def rename_workspace(request: web.Request) -> web.Response:
    """Renames a workspace (its WorkspaceAdmins and admins; never the default one)."""
    body = parse(WorkspaceBody, await read_json(request))
    seen: list[int] = []

    def make(workspace: Workspace) -> RenameWorkspace:
        seen.append(workspace.workspace_id)
        return RenameWorkspace(workspace.workspace_id, body.name)

    await decide_teams(request, _workspace_change(request, make, Permission.UPDATE_WORKSPACE))
    return await _workspace_answer(request, seen[-1])


def _archiving(archived: bool) -> Any:
    async def handler(request: web.Request) -> web.Response:
        parse(EmptyBody, await read_json(request))
        seen: list[int] = []

        def make(workspace: Workspace) -> ArchiveWorkspace:
            seen.append(workspace.workspace_id)
            return ArchiveWorkspace(workspace.workspace_id, archived)

        await decide_teams(request, _workspace_change(request, make, Permission.UPDATE_WORKSPACE))
        return await _workspace_answer(request, seen[-1])

    handler.__doc__ = f"{'Archives' if archived else 'Unarchives'} a workspace."
    return handler


routes.post(
    "/api/v1/workspaces/{workspace}/archive", allow=USERS, body=EmptyBody, response=WorkspaceOut
)(_archiving(True))
routes.post(
    "/api/v1/workspaces/{workspace}/unarchive", allow=USERS, body=EmptyBody, response=WorkspaceOut
)(_archiving(False))


async def _live_tasks(request: web.Request, workspace_id: int) -> str:
    """The tasks of workspace ``workspace_id`` that have not ended, as a refusal to delete it
    names them (``""``: none)."""
    tasks = await live_tasks_in(store_of(request), workspace_id)
    if not tasks:
        return ""
    shown = ", ".join(f"{t.kind} {t.task_id}" for t in tasks[:5])
    return f"{len(tasks)} task(s) that have not ended ({shown}): kill them first"


@routes.add("DELETE", "/api/v1/workspaces/{workspace}", allow=USERS, response=DeletedResponse)
async def delete_workspace(request: web.Request) -> web.Response:
    """Deletes an empty workspace (409 naming what it still holds: projects, models, tasks that
    have not ended)."""
    teams = await current_teams(store_of(request))
    found = _visible_workspace(teams, principal_of(request), request.match_info["workspace"])
    tasks = await _live_tasks(request, found.workspace_id)
    seen: list[int] = []
    models: dict[int, list[str]] = {}

    async def count_models(tx: Transaction) -> None:
        models.clear()
        models.update(await models_by_workspace(tx))

    def make(workspace: Workspace) -> DeleteWorkspace:
        seen.append(workspace.workspace_id)
        names = sorted(models.get(workspace.workspace_id, []))
        held = []
        if names:
            shown = ", ".join(repr(n) for n in names[:5])
            held.append(f"{len(names)} model(s) ({shown}): move or delete them first")
        if tasks and workspace.workspace_id == found.workspace_id:
            held.append(tasks)
        return DeleteWorkspace(workspace.workspace_id, holds="; ".join(held))

    _, events = await decide_teams(
        request,
        _workspace_change(request, make, Permission.DELETE_WORKSPACE),
        before=count_models,
    )
    return web.json_response({"id": seen[-1], "deleted": bool(events)})


# --- projects ----------------------------------------------------------------------------


@routes.get("/api/v1/workspaces/{workspace}/projects", allow=USERS, response=ProjectsResponse)
async def list_projects(request: web.Request) -> web.Response:
    """A workspace's projects, by id."""
    teams = await current_teams(store_of(request))
    workspace = _visible_workspace(teams, principal_of(request), request.match_info["workspace"])
    projects = [describe_project(teams, p) for p in teams.projects_of(workspace.workspace_id)]
    return web.json_response({"projects": projects})


@routes.post(
    "/api/v1/workspaces/{workspace}/projects", allow=USERS, body=ProjectBody, response=ProjectOut
)
async def create_project(request: web.Request) -> web.Response:
    """Creates a project in a workspace (Editors and WorkspaceAdmins of it, admins)."""
    body = parse(ProjectBody, await read_json(request))
    ref = request.match_info["workspace"]
    seen: list[int] = []

    def act(teams: Teams, principal: Principal) -> Decision:
        workspace = _visible_workspace(teams, principal, ref)
        authorize(teams, principal, Permission.CREATE_PROJECT, workspace_id=workspace.workspace_id)
        seen.append(workspace.workspace_id)
        return decide_project(
            teams,
            CreateProject(
                workspace_id=workspace.workspace_id,
                name=body.name,
                actor=principal.name,
                description=body.description,
            ),
        )

    await decide_teams(request, act)
    teams = await current_teams(store_of(request))
    project = teams.project_named(seen[-1], body.name)
    assert project is not None
    return web.json_response(describe_project(teams, project))


@routes.get("/api/v1/projects/{project}", allow=USERS, response=ProjectOut)
async def get_project(request: web.Request) -> web.Response:
    """One project (by id; 404 when unknown or not visible to the caller)."""
    teams = await current_teams(store_of(request))
    project = _visible_project(teams, principal_of(request), request.match_info["project"])
    return web.json_response(describe_project(teams, project))


CHECKED_LIVE = 50
"""How many of a project's projected experiments deletion checks against their streams."""


async def _count_experiments(request: web.Request, project_id: int) -> int:
    """How many experiments project ``project_id`` holds: the projection's, each of the first
    :data:`CHECKED_LIVE` confirmed by its stream (one just moved out no longer counts; one just
    moved in and not projected yet is read as uncategorized if the project goes)."""
    store = store_of(request)
    rows, total = await pr.read_page(
        store,
        tracker_read.list_experiments,
        states=None,
        owner=None,
        archived=None,
        name=None,
        descending=False,
        limit=CHECKED_LIVE,
        offset=0,
        projects=[project_id],
    )
    still = 0
    for row in rows:
        view = await load_experiment(store, int(row["id"]), with_trials=False)
        still += view.project_id == project_id
    return still + max(0, total - len(rows))


async def _project_change(
    request: web.Request, make: Callable[[Project], Any], permission: Permission
) -> tuple[int, list[Any]]:
    ref = request.match_info["project"]
    seen: list[int] = []

    def act(teams: Teams, principal: Principal) -> Decision:
        project = _visible_project(teams, principal, ref)
        authorize(teams, principal, permission, workspace_id=project.workspace_id)
        seen.append(project.project_id)
        return decide_project(teams, make(project))

    _, events = await decide_teams(request, act)
    return seen[-1], events


async def _project_answer(request: web.Request, project_id: int) -> web.Response:
    teams = await current_teams(store_of(request))
    return web.json_response(describe_project(teams, teams.projects[project_id]))


@routes.add(
    "PATCH", "/api/v1/projects/{project}", allow=USERS, body=ProjectPatch, response=ProjectOut
)
async def edit_project(request: web.Request) -> web.Response:
    """Renames a project or changes its description."""
    body = parse(ProjectPatch, await read_json(request))
    project_id, _ = await _project_change(
        request,
        lambda p: EditProject(p.project_id, name=body.name, description=body.description),
        Permission.UPDATE_PROJECT,
    )
    return await _project_answer(request, project_id)


def _project_archiving(archived: bool) -> Any:
    async def handler(request: web.Request) -> web.Response:
        parse(EmptyBody, await read_json(request))
        project_id, _ = await _project_change(
            request, lambda p: ArchiveProject(p.project_id, archived), Permission.UPDATE_PROJECT
        )
        return await _project_answer(request, project_id)

    handler.__doc__ = f"{'Archives' if archived else 'Unarchives'} a project."
    return handler


routes.post("/api/v1/projects/{project}/archive", allow=USERS, body=EmptyBody, response=ProjectOut)(
    _project_archiving(True)
)
routes.post(
    "/api/v1/projects/{project}/unarchive", allow=USERS, body=EmptyBody, response=ProjectOut
)(_project_archiving(False))


@routes.add("DELETE", "/api/v1/projects/{project}", allow=USERS, response=DeletedResponse)
async def delete_project(request: web.Request) -> web.Response:
    """Deletes a project that holds no experiment (409 otherwise)."""
    teams = await current_teams(store_of(request))
    project = _visible_project(teams, principal_of(request), request.match_info["project"])
    count = await _count_experiments(request, project.project_id)
    project_id, events = await _project_change(
        request, lambda p: DeleteProject(p.project_id, count), Permission.DELETE_PROJECT
    )
    return web.json_response({"id": project_id, "deleted": bool(events)})


# --- moving experiments ------------------------------------------------------------------


@routes.post(
    "/api/v1/experiments/{experiment_id}/move", allow=USERS, body=MoveBody, response=MoveResponse
)
async def move_experiment(request: web.Request) -> web.Response:
    """Moves an experiment to another project: the caller may delete it where it is and create
    experiments where it goes; neither project may be archived."""
    principal = principal_of(request)
    experiment_id = experiment_id_of(request)
    body = parse(MoveBody, await read_json(request))
    teams = await current_teams(store_of(request))
    destination = project_by_ref(teams, str(body.destination_project_id))
    authorize(
        teams,
        principal,
        Permission.CREATE_EXPERIMENT,
        workspace_id=destination.workspace_id,
        what=f"moving an experiment into project {destination.name!r}",
    )
    if teams.project_archived(destination.project_id):
        raise ApiError(409, f"project {destination.name!r} is archived: nothing moves into it")
    current = await load_experiment(store_of(request), experiment_id, with_trials=False)
    check_pool(teams, current.settings.pool, destination.workspace_id, status=409)
    command = MoveExperiment(
        project_id=destination.project_id,
        actor=principal.name,
        archived_projects=frozenset(p for p in teams.projects if teams.project_archived(p)),
    )
    _, events = await act_on_experiment(
        request,
        principal,
        experiment_id,
        lambda view: decide_move(view, command),
        permission=Permission.DELETE_EXPERIMENT,
    )
    log.info("experiment moved", experiment_id=experiment_id, project_id=destination.project_id)
    return web.json_response(
        {"id": experiment_id, "project_id": destination.project_id, "moved": bool(events)}
    )
