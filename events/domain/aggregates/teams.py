"""The teams fold: workspaces, projects, user groups and role grants (stream ``teams``).

The default workspace and its project (id 1, ``Uncategorized``) are in every state, even an
empty one: they exist without a fact, cannot be renamed, archived or deleted, and hold what
names no project. A project's workspace never changes (projects do not move), so a project id
answers "which workspace" for everything recorded in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from events.domain.authorization import (
    DEFAULT_NAME,
    DEFAULT_PROJECT_ID,
    DEFAULT_WORKSPACE_ID,
    ROLES,
    Permission,
)
from events.domain.types.teams import (
    TEAMS_FACTS,
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
from events.log.envelope import Event, RecordedEvent


@dataclass
class Workspace:
    """A workspace as folded."""

    workspace_id: int
    name: str
    owner: str = ""
    archived: bool = False
    created_at: datetime | None = None

    @property
    def immutable(self) -> bool:
        """Whether it is the default workspace (no rename, archive or delete)."""
        return self.workspace_id == DEFAULT_WORKSPACE_ID


@dataclass
class Project:
    """A project as folded (``archived``: its own flag; see :meth:`Teams.project_archived`)."""

    project_id: int
    workspace_id: int
    name: str
    description: str = ""
    owner: str = ""
    archived: bool = False
    created_at: datetime | None = None

    @property
    def immutable(self) -> bool:
        """Whether it is the default project (no rename, archive or delete)."""
        return self.project_id == DEFAULT_PROJECT_ID


@dataclass
class Group:
    """A user group as folded."""

    group_id: int
    name: str
    members: set[str] = field(default_factory=set)


@dataclass(frozen=True, order=True)
class Grant:
    """A role granted to a user or group (``principal``: a username, or a group id as text),
    on a workspace or cluster-wide (``workspace_id`` ``None``)."""

    role: str
    principal_kind: PrincipalKind
    principal: str
    workspace_id: int | None = None


def _defaults() -> dict[int, Workspace]:
    return {DEFAULT_WORKSPACE_ID: Workspace(DEFAULT_WORKSPACE_ID, DEFAULT_NAME)}


def _default_projects() -> dict[int, Project]:
    return {DEFAULT_PROJECT_ID: Project(DEFAULT_PROJECT_ID, DEFAULT_WORKSPACE_ID, DEFAULT_NAME)}


@dataclass
class Teams:
    """Stream ``teams`` folded, at stream version ``version``."""

    version: int = 0
    workspaces: dict[int, Workspace] = field(default_factory=_defaults)
    projects: dict[int, Project] = field(default_factory=_default_projects)
    groups: dict[int, Group] = field(default_factory=dict)
    grants: set[Grant] = field(default_factory=set)
    pool_bindings: dict[str, set[int]] = field(default_factory=dict)
    """Bound pools and the workspaces each serves (a pool not here serves every workspace)."""
    last_workspace_id: int = DEFAULT_WORKSPACE_ID
    last_project_id: int = DEFAULT_PROJECT_ID
    last_group_id: int = 0

    # --- lookups -------------------------------------------------------------------------

    def workspace_named(self, name: str) -> Workspace | None:
        """The workspace called ``name``, if any."""
        return next((w for w in self.workspaces.values() if w.name == name), None)

    def project_named(self, workspace_id: int, name: str) -> Project | None:
        """The project called ``name`` in workspace ``workspace_id``, if any."""
        return next(
            (
                p
                for p in self.projects.values()
                if p.workspace_id == workspace_id and p.name == name
            ),
            None,
        )

    def group_named(self, name: str) -> Group | None:
        """The group called ``name``, if any."""
        return next((g for g in self.groups.values() if g.name == name), None)

    def projects_of(self, workspace_id: int) -> list[Project]:
        """The projects of a workspace, by id."""
        return sorted(
            (p for p in self.projects.values() if p.workspace_id == workspace_id),
            key=lambda p: p.project_id,
        )

    def project_or_default(self, project_id: int) -> Project:
        """Project ``project_id``, or the default one when it no longer exists (an experiment
        recorded into a project deleted in a race is read as uncategorized, never lost)."""
        return self.projects.get(project_id) or self.projects[DEFAULT_PROJECT_ID]

    def workspace_of_project(self, project_id: int) -> int:
        """The workspace holding project ``project_id`` (see :meth:`project_or_default`)."""
        return self.project_or_default(project_id).workspace_id

    def project_archived(self, project_id: int) -> bool:
        """Whether the project, or its workspace, is archived."""
        project = self.project_or_default(project_id)
        workspace = self.workspaces.get(project.workspace_id)
        return project.archived or (workspace is not None and workspace.archived)

    def groups_of(self, user: str) -> list[Group]:
        """The groups ``user`` belongs to, by id."""
        return sorted(
            (g for g in self.groups.values() if user in g.members), key=lambda g: g.group_id
        )

    def grants_of(self, user: str) -> list[Grant]:
        """Every grant that applies to ``user``: their own and their groups'."""
        groups = {str(g.group_id) for g in self.groups_of(user)}
        return sorted(
            g
            for g in self.grants
            if (g.principal_kind == "user" and g.principal == user)
            or (g.principal_kind == "group" and g.principal in groups)
        )

    def permissions_of(self, user: str, workspace_id: int | None) -> frozenset[Permission]:
        """What ``user``'s grants permit on workspace ``workspace_id`` (cluster-wide grants
        count everywhere; ``None``: only those)."""
        out: set[Permission] = set()
        for grant in self.grants_of(user):
            if grant.workspace_id is None or grant.workspace_id == workspace_id:
                out |= ROLES.get(grant.role, frozenset())
        return frozenset(out)

    def pool_serves(self, pool: str, workspace_id: int) -> bool:
        """Whether resource pool ``pool`` takes work of workspace ``workspace_id``."""
        bound = self.pool_bindings.get(pool)
        return not bound or workspace_id in bound

    def workspaces_with(self, user: str, permission: Permission) -> set[int] | None:
        """The workspaces where ``user``'s grants give ``permission`` (``None``: all of them,
        a cluster-wide grant gives it)."""
        out: set[int] = set()
        for grant in self.grants_of(user):
            if permission in ROLES.get(grant.role, frozenset()):
                if grant.workspace_id is None:
                    return None
                out.add(grant.workspace_id)
        return out


def apply_teams(state: Teams, recorded: RecordedEvent, event: Event | None = None) -> None:
    """Folds one event of stream ``teams`` (``event``: ``recorded`` already decoded)."""
    state.version = recorded.stream_version
    if recorded.type not in TEAMS_FACTS:
        return
    fact = recorded.decode() if event is None else event
    at = recorded.recorded_at
    if isinstance(fact, WorkspaceCreated):
        state.workspaces[fact.workspace_id] = Workspace(
            fact.workspace_id, fact.name, fact.owner, created_at=at
        )
        state.last_workspace_id = max(state.last_workspace_id, fact.workspace_id)
    elif isinstance(fact, WorkspaceRenamed):
        if workspace := state.workspaces.get(fact.workspace_id):
            workspace.name = fact.name
    elif isinstance(fact, WorkspaceArchived):
        if workspace := state.workspaces.get(fact.workspace_id):
            workspace.archived = fact.archived
    elif isinstance(fact, WorkspaceDeleted):
        state.workspaces.pop(fact.workspace_id, None)
        state.grants = {g for g in state.grants if g.workspace_id != fact.workspace_id}
        for bound in state.pool_bindings.values():
            bound.discard(fact.workspace_id)
    elif isinstance(fact, ProjectCreated):
        state.projects[fact.project_id] = Project(
            fact.project_id, fact.workspace_id, fact.name, fact.description, fact.owner,
            created_at=at,
        )  # fmt: skip
        state.last_project_id = max(state.last_project_id, fact.project_id)
    elif isinstance(fact, ProjectEdited):
        if project := state.projects.get(fact.project_id):
            project.name = fact.name if fact.name is not None else project.name
            if fact.description is not None:
                project.description = fact.description
    elif isinstance(fact, ProjectArchived):
        if project := state.projects.get(fact.project_id):
            project.archived = fact.archived
    elif isinstance(fact, ProjectDeleted):
        state.projects.pop(fact.project_id, None)
    else:
        _apply_access(state, fact)


def _apply_access(state: Teams, fact: Event) -> None:
    if isinstance(fact, GroupCreated):
        state.groups[fact.group_id] = Group(fact.group_id, fact.name, set(fact.members))
        state.last_group_id = max(state.last_group_id, fact.group_id)
    elif isinstance(fact, GroupChanged):
        if group := state.groups.get(fact.group_id):
            group.name = fact.name if fact.name is not None else group.name
            group.members = (group.members | set(fact.added)) - set(fact.removed)
    elif isinstance(fact, GroupDeleted):
        state.groups.pop(fact.group_id, None)
        key = str(fact.group_id)
        state.grants = {
            g for g in state.grants if not (g.principal_kind == "group" and g.principal == key)
        }
    elif isinstance(fact, RoleAssigned):
        state.grants.add(Grant(fact.role, fact.principal_kind, fact.principal, fact.workspace_id))
    elif isinstance(fact, RoleUnassigned):
        state.grants.discard(
            Grant(fact.role, fact.principal_kind, fact.principal, fact.workspace_id)
        )
    elif isinstance(fact, PoolBindingsSet):
        if fact.workspace_ids:
            state.pool_bindings[fact.pool] = set(fact.workspace_ids)
        else:
            state.pool_bindings.pop(fact.pool, None)


def fold_teams(events: Iterable[RecordedEvent]) -> Teams:
    """Folds stream ``teams`` (other types only move ``version``)."""
    state = Teams()
    for recorded in events:
        apply_teams(state, recorded)
    return state


__all__ = [
    "Grant",
    "Group",
    "Project",
    "Teams",
    "Workspace",
    "apply_teams",
    "fold_teams",
]
