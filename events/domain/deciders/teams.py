"""The teams' decider: workspaces, projects, user groups and role grants.

Decided over stream ``teams`` folded (:class:`~events.domain.aggregates.teams.Teams`). Whether
the caller may act is the caller's check (:func:`events.domain.authorization.permitted`), and so
is whether a named user exists (users live in the gateway's table, not in the log) and how many
experiments a project holds (the caller counts them and passes the count in the command).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from events.domain.aggregates.teams import Teams
from events.domain.authorization import ROLES, cluster_wide
from events.domain.deciders import Decision, Refusal, conflict, invalid, not_found
from events.domain.types.teams import (
    MAX_NAME,
    GroupChanged,
    GroupCreated,
    GroupDeleted,
    PoolBindingsSet,
    PrincipalKind,
    ProjectArchived,
    ProjectCreated,
    ProjectDeleted,
    ProjectEdited,
    RoleAssigned,
    RoleUnassigned,
    WorkspaceArchived,
    WorkspaceCreated,
    WorkspaceDeleted,
    WorkspaceRenamed,
)

MAX_GROUP_CHANGE = 1000
"""The most users one group change adds or removes."""


def name_problem(name: str, what: str) -> str | None:
    """Why ``name`` cannot name a workspace, project or group (``None``: it can)."""
    if not name.strip():
        return f"a {what} name needs a character other than spaces"
    if len(name) > MAX_NAME:
        return f"a {what} name is at most {MAX_NAME} characters (this one has {len(name)})"
    if any(unicodedata.category(c).startswith("C") for c in name):
        return f"a {what} name holds no control characters"
    if name != name.strip():
        return f"a {what} name does not begin or end with spaces"
    return None


def _bad_name(name: str, what: str, path: str = "name") -> Refusal | None:
    problem = name_problem(name, what)
    return invalid(f"{path}: {problem}", path) if problem else None


# --- workspaces --------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateWorkspace:
    """Create a workspace named ``name``; its creator ``actor`` becomes its WorkspaceAdmin."""

    name: str
    actor: str


@dataclass(frozen=True)
class RenameWorkspace:
    """Rename workspace ``workspace_id`` to ``name``."""

    workspace_id: int
    name: str


@dataclass(frozen=True)
class ArchiveWorkspace:
    """Archive (``archived``) or unarchive workspace ``workspace_id``."""

    workspace_id: int
    archived: bool


@dataclass(frozen=True)
class DeleteWorkspace:
    """Delete workspace ``workspace_id`` (refused while it holds a project, or ``holds`` names
    what else it holds: the caller's count of its models and tasks)."""

    workspace_id: int
    holds: str = ""


def decide_workspace(
    state: Teams, command: CreateWorkspace | RenameWorkspace | ArchiveWorkspace | DeleteWorkspace
) -> Decision:
    """The facts of a workspace command, or why not."""
    if isinstance(command, CreateWorkspace):
        if refused := _bad_name(command.name, "workspace"):
            return refused
        if state.workspace_named(command.name) is not None:
            return conflict(f"name: a workspace named {command.name!r} exists", "name")
        new_id = state.last_workspace_id + 1
        return [
            WorkspaceCreated(workspace_id=new_id, name=command.name, owner=command.actor),
            RoleAssigned(
                role="WorkspaceAdmin",
                principal_kind="user",
                principal=command.actor,
                workspace_id=new_id,
            ),
        ]
    workspace = state.workspaces.get(command.workspace_id)
    if workspace is None:
        return not_found(f"no workspace {command.workspace_id}")
    if workspace.immutable:
        return conflict(f"workspace {workspace.name!r} is the default one: it cannot change")
    if isinstance(command, RenameWorkspace):
        if refused := _bad_name(command.name, "workspace"):
            return refused
        if workspace.archived:
            return conflict(f"workspace {workspace.name!r} is archived: unarchive it first")
        if command.name == workspace.name:
            return []
        if state.workspace_named(command.name) is not None:
            return conflict(f"name: a workspace named {command.name!r} exists", "name")
        return [WorkspaceRenamed(workspace_id=workspace.workspace_id, name=command.name)]
    if isinstance(command, ArchiveWorkspace):
        if workspace.archived == command.archived:
            return []
        return [WorkspaceArchived(workspace_id=workspace.workspace_id, archived=command.archived)]
    projects = state.projects_of(workspace.workspace_id)
    if projects:
        names = ", ".join(repr(p.name) for p in projects[:5])
        return conflict(
            f"workspace {workspace.name!r} still holds {len(projects)} project(s) ({names}): "
            "delete them first"
        )
    if command.holds:
        return conflict(f"workspace {workspace.name!r} still holds {command.holds}")
    return [WorkspaceDeleted(workspace_id=workspace.workspace_id)]


# --- projects ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateProject:
    """Create project ``name`` in workspace ``workspace_id``."""

    workspace_id: int
    name: str
    actor: str
    description: str = ""


@dataclass(frozen=True)
class EditProject:
    """Rename project ``project_id`` or change its description (``None``: keep)."""

    project_id: int
    name: str | None = None
    description: str | None = None


@dataclass(frozen=True)
class ArchiveProject:
    """Archive (``archived``) or unarchive project ``project_id``."""

    project_id: int
    archived: bool


@dataclass(frozen=True)
class DeleteProject:
    """Delete project ``project_id``, which holds ``experiments`` experiments (the caller's
    count; refused unless 0)."""

    project_id: int
    experiments: int


def decide_project(
    state: Teams, command: CreateProject | EditProject | ArchiveProject | DeleteProject
) -> Decision:
    """The facts of a project command, or why not."""
    if isinstance(command, CreateProject):
        workspace = state.workspaces.get(command.workspace_id)
        if workspace is None:
            return not_found(f"no workspace {command.workspace_id}")
        if refused := _bad_name(command.name, "project"):
            return refused
        if workspace.archived:
            return conflict(f"workspace {workspace.name!r} is archived: it takes no new project")
        if state.project_named(workspace.workspace_id, command.name) is not None:
            return conflict(
                f"name: workspace {workspace.name!r} has a project named {command.name!r}", "name"
            )
        return [
            ProjectCreated(
                project_id=state.last_project_id + 1,
                workspace_id=workspace.workspace_id,
                name=command.name,
                description=command.description,
                owner=command.actor,
            )
        ]
    project = state.projects.get(command.project_id)
    if project is None:
        return not_found(f"no project {command.project_id}")
    if project.immutable:
        return conflict(f"project {project.name!r} is the default one: it cannot change")
    workspace_archived = state.workspaces[project.workspace_id].archived
    if workspace_archived:
        return conflict(f"project {project.name!r} is in an archived workspace")
    if isinstance(command, EditProject):
        if project.archived:
            return conflict(f"project {project.name!r} is archived: unarchive it first")
        name = command.name if command.name != project.name else None
        if name is not None:
            if refused := _bad_name(name, "project"):
                return refused
            if state.project_named(project.workspace_id, name) is not None:
                return conflict(f"name: the workspace has a project named {name!r}", "name")
        description = command.description if command.description != project.description else None
        if name is None and description is None:
            return []
        return [ProjectEdited(project_id=project.project_id, name=name, description=description)]
    if isinstance(command, ArchiveProject):
        if project.archived == command.archived:
            return []
        return [ProjectArchived(project_id=project.project_id, archived=command.archived)]
    if command.experiments:
        return conflict(
            f"project {project.name!r} still holds {command.experiments} experiment(s): move or "
            "delete them first"
        )
    return [ProjectDeleted(project_id=project.project_id)]


# --- groups and roles --------------------------------------------------------------------


@dataclass(frozen=True)
class CreateGroup:
    """Create user group ``name`` with ``members`` (existing users: the caller checked)."""

    name: str
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChangeGroup:
    """Rename group ``group_id`` (``name``; ``None``: keep), add and remove members."""

    group_id: int
    name: str | None = None
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeleteGroup:
    """Delete group ``group_id`` and its grants."""

    group_id: int


def decide_group(state: Teams, command: CreateGroup | ChangeGroup | DeleteGroup) -> Decision:
    """The facts of a group command, or why not."""
    if isinstance(command, CreateGroup):
        if refused := _bad_name(command.name, "group"):
            return refused
        if state.group_named(command.name) is not None:
            return conflict(f"name: a group named {command.name!r} exists", "name")
        if len(command.members) > MAX_GROUP_CHANGE:
            return invalid(f"add_users: at most {MAX_GROUP_CHANGE} at once", "add_users")
        return [
            GroupCreated(
                group_id=state.last_group_id + 1,
                name=command.name,
                members=sorted(set(command.members)),
            )
        ]
    group = state.groups.get(command.group_id)
    if group is None:
        return not_found(f"no group {command.group_id}")
    if isinstance(command, DeleteGroup):
        return [GroupDeleted(group_id=group.group_id)]
    if len(command.added) + len(command.removed) > MAX_GROUP_CHANGE:
        return invalid(f"a change adds and removes at most {MAX_GROUP_CHANGE} users", "add_users")
    name = command.name if command.name != group.name else None
    if name is not None:
        if refused := _bad_name(name, "group"):
            return refused
        if state.group_named(name) is not None:
            return conflict(f"name: a group named {name!r} exists", "name")
    added = sorted(set(command.added) - group.members)
    removed = sorted(set(command.removed) & group.members)
    if name is None and not added and not removed:
        return []
    return [GroupChanged(group_id=group.group_id, name=name, added=added, removed=removed)]


@dataclass(frozen=True)
class ChangeRole:
    """Grant (``assign``) or withdraw ``role`` to or from a user or group, on a workspace or
    cluster-wide (``workspace_id`` ``None``)."""

    role: str
    principal_kind: PrincipalKind
    principal: str
    workspace_id: int | None
    assign: bool = True


def decide_role(state: Teams, command: ChangeRole) -> Decision:
    """``RoleAssigned``/``RoleUnassigned``, nothing for a repeat, or why not."""
    if command.role not in ROLES:
        return invalid(
            f"role_name: no role {command.role!r} (one of {', '.join(ROLES)})", "role_name"
        )
    if command.workspace_id is not None:
        if command.workspace_id not in state.workspaces:
            return not_found(f"no workspace {command.workspace_id}")
        if cluster_wide(command.role):
            return invalid(
                f"role_name: {command.role} holds cluster-wide permissions: it is granted "
                "cluster-wide only (no workspace)",
                "workspace_name",
            )
    if command.principal_kind == "group" and (
        not (command.principal.isascii() and command.principal.isdigit())
        or int(command.principal) not in state.groups
    ):
        return not_found(f"no group {command.principal}")
    held = any(
        g.role == command.role
        and g.principal_kind == command.principal_kind
        and g.principal == command.principal
        and g.workspace_id == command.workspace_id
        for g in state.grants
    )
    if command.assign == held:
        return []
    kind = RoleAssigned if command.assign else RoleUnassigned
    return [
        kind(
            role=command.role,
            principal_kind=command.principal_kind,
            principal=command.principal,
            workspace_id=command.workspace_id,
        )
    ]


DEFAULT_POOL = "default"
"""The cluster's default pool, which serves every workspace and cannot be bound."""


@dataclass(frozen=True)
class BindPool:
    """Change the workspaces pool ``pool`` serves: ``replace`` them all (when not ``None``), or
    ``add`` and ``remove`` some."""

    pool: str
    add: tuple[int, ...] = ()
    remove: tuple[int, ...] = ()
    replace: tuple[int, ...] | None = None


def decide_bindings(state: Teams, command: BindPool) -> Decision:
    """``PoolBindingsSet`` with the pool's new workspaces, nothing when they do not change, or
    why not (the default pool; a workspace that does not exist)."""
    if command.pool in ("", DEFAULT_POOL):
        return conflict("the default pool serves every workspace: it cannot be bound", "pool")
    for workspace_id in (*command.add, *command.remove, *(command.replace or ())):
        if workspace_id not in state.workspaces:
            return not_found(f"no workspace {workspace_id}")
    before = state.pool_bindings.get(command.pool, set())
    after = (
        set(command.replace)
        if command.replace is not None
        else (before | set(command.add)) - set(command.remove)
    )
    if after == before:
        return []
    return [PoolBindingsSet(pool=command.pool, workspace_ids=sorted(after))]


__all__ = [
    "DEFAULT_POOL",
    "ArchiveProject",
    "ArchiveWorkspace",
    "BindPool",
    "ChangeGroup",
    "ChangeRole",
    "CreateGroup",
    "CreateProject",
    "CreateWorkspace",
    "DeleteGroup",
    "DeleteProject",
    "DeleteWorkspace",
    "EditProject",
    "RenameWorkspace",
    "decide_bindings",
    "decide_group",
    "decide_project",
    "decide_role",
    "decide_workspace",
    "name_problem",
]
