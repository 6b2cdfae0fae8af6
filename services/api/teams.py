"""Stream ``teams`` as the gateway reads it, and the one authorization check routes call.

:func:`current_teams` keeps the fold per store and reads only what was appended since (one
indexed query per request that needs it); a decision folds afresh in its transaction
(:func:`load_teams`), so it is made at the version it appends at.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from events.domain.aggregates.teams import Project, Teams, Workspace, apply_teams
from events.domain.authorization import DEFAULT_PROJECT_ID, Permission, permitted
from events.domain.config.experiment_settings import ExperimentSettings
from events.domain.deciders import Decision
from events.domain.types.teams import TEAMS_FACTS, TEAMS_STREAM
from events.log.store import EventStore, Transaction
from services.api.auth import Principal, principal_of
from services.api.decided import append_accepted
from services.api.errors import ApiError, bad_request, forbidden, not_found
from services.api.inbox import in_transaction
from services.api.routing import store_of
from services.api.stream_folds import StreamFold
from services.api.views import Reader

TEAMS: StreamFold[Teams] = StreamFold(TEAMS_STREAM, TEAMS_FACTS, Teams, apply_teams)
"""Stream ``teams`` as the gateway folds it."""


async def load_teams(reader: Reader, *, at: int | None = None) -> Teams:
    """Stream ``teams`` folded afresh (at log position ``at``, when given); its version is the
    stream's head, the version a decision appends at."""
    return await TEAMS.load(reader, at=at)


async def current_teams(store: EventStore) -> Teams:
    """The teams as of now (read only; never mutate it)."""
    return await TEAMS.current(store)


async def teams_for(reader: Reader) -> Teams:
    """:func:`current_teams` of a store; folded afresh in a transaction (what it will decide
    on)."""
    return await TEAMS.for_reader(reader)


async def decide_teams(
    request: web.Request,
    decide: Callable[[Teams, Principal], Decision],
    *,
    before: Callable[[Transaction], Awaitable[None]] | None = None,
) -> tuple[Teams, list[Any]]:
    """Folds the teams in a transaction, lets ``decide`` authorize the caller (raising its
    ``ApiError``) and decide, and appends its events at the folded version, decided again
    after a concurrent append (:func:`services.api.inbox.in_transaction`).

    Args:
        request: the request whose caller acts.
        decide: the decision, from the teams and the caller.
        before: run first in the transaction, before the teams are read (to take a lock and
            read what ``decide`` needs besides the teams).

    Returns:
        The teams as folded before the change, and the events appended (none: no change).
    """
    principal = principal_of(request)

    async def work(tx: Transaction) -> tuple[Teams, list[Any]]:
        if before is not None:
            await before(tx)
        teams = await load_teams(tx)
        events = await append_accepted(
            tx,
            TEAMS_STREAM,
            decide(teams, principal),
            expected_version=teams.version,
            actor=principal.name,
        )
        return teams, events

    return await in_transaction(store_of(request), work)


def allows(
    teams: Teams,
    principal: Principal,
    permission: Permission,
    *,
    workspace_id: int | None = None,
    owner: str | None = None,
) -> bool:
    """Whether a user ``principal`` may act with ``permission`` (see
    :func:`events.domain.authorization.permitted`); tokens of trials, agents and joins hold no
    role and are refused here (their own routes check them)."""
    if principal.kind != "user":
        return False
    return permitted(
        teams,
        principal.name,
        permission,
        admin=principal.is_admin,
        workspace_id=workspace_id,
        owner=owner,
    )


def authorize(
    teams: Teams,
    principal: Principal,
    permission: Permission,
    *,
    workspace_id: int | None = None,
    owner: str | None = None,
    what: str = "",
) -> None:
    """Raises 403 naming the missing permission unless :func:`allows`."""
    if allows(teams, principal, permission, workspace_id=workspace_id, owner=owner):
        return
    where = "cluster-wide" if workspace_id is None else f"in workspace {_name(teams, workspace_id)}"
    raise forbidden(
        f"{principal.name} lacks permission {permission.value} {where}"
        + (f" ({what})" if what else "")
    )


def _name(teams: Teams, workspace_id: int) -> str:
    workspace = teams.workspaces.get(workspace_id)
    return repr(workspace.name) if workspace else str(workspace_id)


def workspace_by_ref(teams: Teams, ref: str) -> Workspace:
    """The workspace ``ref`` names (its id, or its name); 404 otherwise."""
    if ref.isascii() and ref.isdigit() and int(ref) in teams.workspaces:
        return teams.workspaces[int(ref)]
    found = teams.workspace_named(ref)
    if found is None:
        raise not_found(f"no workspace {ref[:100]!r}")
    return found


def project_by_ref(teams: Teams, ref: str, workspace: Workspace | None = None) -> Project:
    """The project ``ref`` names (its id; or its name in ``workspace``); 404 otherwise."""
    if ref.isascii() and ref.isdigit() and int(ref) in teams.projects:
        project = teams.projects[int(ref)]
        if workspace is None or project.workspace_id == workspace.workspace_id:
            return project
    if workspace is not None:
        found = teams.project_named(workspace.workspace_id, ref)
        if found is not None:
            return found
    raise not_found(
        f"no project {ref[:100]!r}" + (f" in workspace {workspace.name!r}" if workspace else "")
    )


def project_for_experiment(
    teams: Teams,
    principal: Principal,
    config: dict[str, object],
    project_id: int | None = None,
) -> Project:
    """The project a new experiment goes in: ``project_id`` when given, else the config's
    ``workspace`` and ``project`` (both or neither; neither: the default project). 400 naming
    the field for an unknown one, 409 for an archived one, 403 unless the caller may create
    experiments in its workspace."""
    if project_id is not None:
        if project_id not in teams.projects:
            raise bad_request(f"project_id: no project {project_id}", path="project_id")
        project = teams.projects[project_id]
    else:
        workspace_name = str(config.get("workspace") or "")
        project_name = str(config.get("project") or "")
        if bool(workspace_name) != bool(project_name):
            missing = "project" if workspace_name else "workspace"
            raise bad_request(
                f"config.{missing}: set both workspace and project, or neither", path=missing
            )
        if not workspace_name:
            project = teams.projects[DEFAULT_PROJECT_ID]
        else:
            workspace = teams.workspace_named(workspace_name)
            if workspace is None:
                raise bad_request(
                    f"config.workspace: no workspace {workspace_name[:100]!r}", path="workspace"
                )
            found = teams.project_named(workspace.workspace_id, project_name)
            if found is None:
                raise bad_request(
                    f"config.project: workspace {workspace_name[:100]!r} has no project "
                    f"{project_name[:100]!r}",
                    path="project",
                )
            project = found
    authorize(
        teams,
        principal,
        Permission.CREATE_EXPERIMENT,
        workspace_id=project.workspace_id,
        what=f"creating an experiment in project {project.name!r}",
    )
    if teams.project_archived(project.project_id):
        raise ApiError(409, f"project {project.name!r} is archived: it takes no new experiment")
    check_pool(teams, ExperimentSettings.of(config).pool, project.workspace_id)
    return project


def check_pool(teams: Teams, pool: str, workspace_id: int, *, status: int = 400) -> None:
    """Raises ``status`` (400 naming ``resources.resource_pool``) unless resource pool ``pool``
    serves workspace ``workspace_id`` (a bound pool serves only its workspaces)."""
    if teams.pool_serves(pool or "default", workspace_id):
        return
    served = ", ".join(
        repr(teams.workspaces[w].name)
        for w in sorted(teams.pool_bindings.get(pool, ()))
        if w in teams.workspaces
    )
    workspace = teams.workspaces.get(workspace_id)
    raise ApiError(
        status,
        f"resources.resource_pool: pool {pool!r} serves workspace(s) {served} only, not "
        f"{workspace.name if workspace else workspace_id!r}",
        path="resources.resource_pool",
    )


def placement(teams: Teams, project_id: int) -> dict[str, object]:
    """Where something of project ``project_id`` is, by ids and names (the default project
    for one deleted since)."""
    project = teams.project_or_default(project_id)
    workspace = teams.workspaces.get(project.workspace_id)
    return {
        "project_id": project.project_id,
        "project": project.name,
        "workspace_id": project.workspace_id,
        "workspace": workspace.name if workspace else "",
    }


def visible_projects(teams: Teams, principal: Principal) -> list[int] | None:
    """The projects where ``principal`` sees every user's experiments (``None``: all)."""
    if principal.is_admin:
        return None
    workspaces = teams.workspaces_with(principal.name, Permission.VIEW_EXPERIMENT)
    if workspaces is None:
        return None
    return sorted(p.project_id for p in teams.projects.values() if p.workspace_id in workspaces)


__all__ = [
    "allows",
    "authorize",
    "check_pool",
    "current_teams",
    "decide_teams",
    "load_teams",
    "placement",
    "project_by_ref",
    "project_for_experiment",
    "teams_for",
    "visible_projects",
    "workspace_by_ref",
]
