"""Roles and user groups: the built-in roles, granting and withdrawing them, groups of users,
and what the caller may do (decided by :mod:`events.domain.deciders.teams`).

Granting a role on a workspace needs ``assign_roles`` there (its WorkspaceAdmins); granting one
cluster-wide, and changing groups, is for admins. Every grant and withdrawal is a fact on stream
``teams``, so the audit trail and time travel show who could do what, when.
"""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field, model_validator

from events.domain.aggregates.teams import Group, Teams
from events.domain.authorization import CLUSTER_ONLY, ROLE_DESCRIPTIONS, ROLES, Permission
from events.domain.deciders import Decision
from events.domain.deciders.teams import (
    MAX_GROUP_CHANGE,
    ChangeGroup,
    ChangeRole,
    CreateGroup,
    DeleteGroup,
    decide_group,
    decide_role,
)
from events.domain.types.teams import MAX_NAME
from services.api.auth import Principal, principal_of, user_exists
from services.api.errors import ApiError, bad_request, parse, read_json
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import allows, authorize, current_teams, decide_teams, workspace_by_ref

log = structlog.get_logger("api")
routes = RouteTable("rbac")

Username = str


class RoleOut(BaseModel):
    """A built-in role."""

    name: str
    description: str
    permissions: list[str]
    cluster_only: bool


class RolesResponse(BaseModel):
    """Every built-in role."""

    roles: list[RoleOut]


class AssignmentBody(BaseModel):
    """A role, who gets it (exactly one of a user and a group), and where (a workspace's id or
    name; none: cluster-wide)."""

    model_config = {"extra": "forbid"}

    role_name: str = Field(max_length=100)
    username: str | None = Field(None, max_length=200)
    group_name: str | None = Field(None, max_length=MAX_NAME * 4)
    workspace: str | None = Field(None, max_length=MAX_NAME * 4)

    @model_validator(mode="after")
    def _one_principal(self) -> AssignmentBody:
        if (self.username is None) == (self.group_name is None):
            raise ValueError("give exactly one of username and group_name")
        return self


class AssignmentOut(BaseModel):
    """One grant."""

    role: str
    username: str | None
    group_name: str | None
    workspace_id: int | None
    workspace: str | None


class AssignmentsResponse(BaseModel):
    """Grants, and whether this request changed them."""

    assignments: list[AssignmentOut]
    changed: bool = False


class GroupOut(BaseModel):
    """A user group."""

    id: int
    name: str
    members: list[str]


class GroupsResponse(BaseModel):
    """User groups, by id."""

    groups: list[GroupOut]


class GroupBody(BaseModel):
    """A new group and its first members."""

    model_config = {"extra": "forbid"}

    name: str = Field(max_length=MAX_NAME * 4)
    add_users: list[Username] = Field(default_factory=list, max_length=MAX_GROUP_CHANGE)


class GroupPatch(BaseModel):
    """A group's new name and the members it gains and loses."""

    model_config = {"extra": "forbid"}

    name: str | None = Field(None, max_length=MAX_NAME * 4)
    add_users: list[Username] = Field(default_factory=list, max_length=MAX_GROUP_CHANGE)
    remove_users: list[Username] = Field(default_factory=list, max_length=MAX_GROUP_CHANGE)


class PermissionsResponse(BaseModel):
    """What the caller may do: cluster-wide, and in each workspace they may see."""

    username: str
    admin: bool
    cluster: list[str]
    workspaces: dict[str, list[str]]
    assignments: list[AssignmentOut]


def _assignment(teams: Teams, role: str, kind: str, who: str, ws: int | None) -> dict[str, Any]:
    group = (
        teams.groups.get(int(who)) if kind == "group" and who.isascii() and who.isdigit() else None
    )
    workspace = teams.workspaces.get(ws) if ws is not None else None
    return {
        "role": role,
        "username": who if kind == "user" else None,
        "group_name": group.name if group else (None if kind == "user" else who),
        "workspace_id": ws,
        "workspace": workspace.name if workspace else None,
    }


def _describe_group(group: Group) -> dict[str, Any]:
    return {"id": group.group_id, "name": group.name, "members": sorted(group.members)}


@routes.get("/api/v1/roles", allow=USERS, response=RolesResponse)
async def list_roles(request: web.Request) -> web.Response:
    """The built-in roles and their permissions."""
    roles = [
        {
            "name": name,
            "description": ROLE_DESCRIPTIONS[name],
            "permissions": sorted(p.value for p in permissions),
            "cluster_only": bool(permissions & CLUSTER_ONLY),
        }
        for name, permissions in ROLES.items()
    ]
    return web.json_response({"roles": roles})


@routes.get("/api/v1/roles/assignments", allow=USERS, response=AssignmentsResponse)
async def list_assignments(request: web.Request) -> web.Response:
    """Every grant (admins), or the caller's own and those of workspaces they administer."""
    principal = principal_of(request)
    teams = await current_teams(store_of(request))
    shown = [
        _assignment(teams, g.role, g.principal_kind, g.principal, g.workspace_id)
        for g in sorted(teams.grants)
        if principal.is_admin
        or g in teams.grants_of(principal.name)
        or (
            g.workspace_id is not None
            and Permission.ASSIGN_ROLES in teams.permissions_of(principal.name, g.workspace_id)
        )
    ]
    return web.json_response({"assignments": shown})


async def _change_role(request: web.Request, assign: bool) -> web.Response:
    body = parse(AssignmentBody, await read_json(request))
    store = store_of(request)
    if body.username is not None and not await user_exists(store, body.username):
        raise bad_request(f"username: no user {body.username[:100]!r}", path="username")

    def act(teams: Teams, principal: Principal) -> Decision:
        workspace_id = (
            workspace_by_ref(teams, body.workspace).workspace_id
            if body.workspace is not None
            else None
        )
        authorize(
            teams,
            principal,
            Permission.ASSIGN_ROLES,
            workspace_id=workspace_id,
            what=f"{'granting' if assign else 'withdrawing'} role {body.role_name}",
        )
        if body.group_name is not None:
            group = teams.group_named(body.group_name)
            if group is None:
                raise ApiError(404, f"no group {body.group_name[:100]!r}")
            kind, who = "group", str(group.group_id)
        else:
            assert body.username is not None
            kind, who = "user", body.username
        return decide_role(
            teams,
            ChangeRole(
                role=body.role_name,
                principal_kind="group" if kind == "group" else "user",
                principal=who,
                workspace_id=workspace_id,
                assign=assign,
            ),
        )

    _, events = await decide_teams(request, act)
    teams = await current_teams(store)
    shown = [
        _assignment(teams, e.role, e.principal_kind, e.principal, e.workspace_id) for e in events
    ]
    log.info("role changed", assign=assign, changed=bool(events))
    return web.json_response({"assignments": shown, "changed": bool(events)})


@routes.post(
    "/api/v1/roles/add-assignments",
    allow=USERS,
    body=AssignmentBody,
    response=AssignmentsResponse,
)
async def add_assignment(request: web.Request) -> web.Response:
    """Grants a role to a user or group, on a workspace or cluster-wide."""
    return await _change_role(request, True)


@routes.post(
    "/api/v1/roles/remove-assignments",
    allow=USERS,
    body=AssignmentBody,
    response=AssignmentsResponse,
)
async def remove_assignment(request: web.Request) -> web.Response:
    """Withdraws a role granted to a user or group."""
    return await _change_role(request, False)


@routes.get("/api/v1/permissions/summary", allow=USERS, response=PermissionsResponse)
async def my_permissions(request: web.Request) -> web.Response:
    """What the caller may do, cluster-wide and per workspace, and their grants."""
    principal = principal_of(request)
    teams = await current_teams(store_of(request))
    everything = sorted(p.value for p in Permission)
    cluster = everything if principal.is_admin else sorted(
        p.value for p in teams.permissions_of(principal.name, None)
    )  # fmt: skip
    workspaces: dict[str, list[str]] = {}
    for workspace_id, workspace in sorted(teams.workspaces.items()):
        allowed = [
            p.value for p in Permission if allows(teams, principal, p, workspace_id=workspace_id)
        ]
        if Permission.VIEW_WORKSPACE.value in allowed:
            workspaces[workspace.name] = sorted(allowed)
    grants = [
        _assignment(teams, g.role, g.principal_kind, g.principal, g.workspace_id)
        for g in teams.grants_of(principal.name)
    ]
    return web.json_response(
        {
            "username": principal.name,
            "admin": principal.is_admin,
            "cluster": cluster,
            "workspaces": workspaces,
            "assignments": grants,
        }
    )


# --- groups ------------------------------------------------------------------------------


@routes.get("/api/v1/groups", allow=USERS, response=GroupsResponse)
async def list_groups(request: web.Request) -> web.Response:
    """Every group (admins), or the caller's own."""
    principal = principal_of(request)
    teams = await current_teams(store_of(request))
    groups = [
        _describe_group(g)
        for _, g in sorted(teams.groups.items())
        if principal.is_admin or principal.name in g.members
    ]
    return web.json_response({"groups": groups})


async def _existing_users(request: web.Request, names: list[str], path: str) -> None:
    store = store_of(request)
    for name in dict.fromkeys(names):
        if not await user_exists(store, name):
            raise bad_request(f"{path}: no user {name[:100]!r}", path=path)


@routes.post("/api/v1/groups", allow=USERS, body=GroupBody, response=GroupOut)
async def create_group(request: web.Request) -> web.Response:
    """Creates a user group (admins)."""
    body = parse(GroupBody, await read_json(request))
    await _existing_users(request, body.add_users, "add_users")

    def act(teams: Teams, principal: Principal) -> Decision:
        authorize(teams, principal, Permission.UPDATE_GROUP, what="creating a group")
        return decide_group(teams, CreateGroup(body.name, tuple(body.add_users)))

    await decide_teams(request, act)
    teams = await current_teams(store_of(request))
    group = teams.group_named(body.name)
    assert group is not None
    return web.json_response(_describe_group(group))


def _group_of(teams: Teams, ref: str) -> Group:
    if ref.isascii() and ref.isdigit() and int(ref) in teams.groups:
        return teams.groups[int(ref)]
    group = teams.group_named(ref)
    if group is None:
        raise ApiError(404, f"no group {ref[:100]!r}")
    return group


@routes.get("/api/v1/groups/{group}", allow=USERS, response=GroupOut)
async def get_group(request: web.Request) -> web.Response:
    """One group (admins and its members; by id or name)."""
    principal = principal_of(request)
    teams = await current_teams(store_of(request))
    group = _group_of(teams, request.match_info["group"])
    if not (principal.is_admin or principal.name in group.members):
        raise ApiError(404, f"no group {request.match_info['group'][:100]!r}")
    return web.json_response(_describe_group(group))


@routes.add("PATCH", "/api/v1/groups/{group}", allow=USERS, body=GroupPatch, response=GroupOut)
async def change_group(request: web.Request) -> web.Response:
    """Renames a group, adds and removes members (admins)."""
    body = parse(GroupPatch, await read_json(request))
    await _existing_users(request, body.add_users, "add_users")
    ref = request.match_info["group"]
    seen: list[int] = []

    def act(teams: Teams, principal: Principal) -> Decision:
        authorize(teams, principal, Permission.UPDATE_GROUP, what="changing a group")
        group = _group_of(teams, ref)
        seen.append(group.group_id)
        return decide_group(
            teams,
            ChangeGroup(group.group_id, body.name, tuple(body.add_users), tuple(body.remove_users)),
        )

    await decide_teams(request, act)
    teams = await current_teams(store_of(request))
    return web.json_response(_describe_group(teams.groups[seen[-1]]))


@routes.add("DELETE", "/api/v1/groups/{group}", allow=USERS, response=GroupOut)
async def delete_group(request: web.Request) -> web.Response:
    """Deletes a group and its grants (admins)."""
    ref = request.match_info["group"]
    seen: list[Group] = []

    def act(teams: Teams, principal: Principal) -> Decision:
        authorize(teams, principal, Permission.UPDATE_GROUP, what="deleting a group")
        group = _group_of(teams, ref)
        seen.append(group)
        return decide_group(teams, DeleteGroup(group.group_id))

    await decide_teams(request, act)
    return web.json_response(_describe_group(seen[-1]))
