"""Facts on the stream of teams (``teams``): workspaces, projects, user groups, roles and the
workspaces each resource pool serves.

Every such fact lives on one stream because each decision is made against all of them: a
workspace's name is unique in the cluster, a project's within its workspace, a role is granted
on a workspace that exists to a group that exists, and ids are the next free ones. Team changes
are rare (people create a project, not a thousand a second), so one stream orders them at no
cost worth measuring.

Workspace 1 and its project 1, both named ``Uncategorized``, exist without a fact: they hold
what names no project, including every experiment recorded before projects existed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from events.log.envelope import Event
from events.log.registry import register

TEAMS_STREAM = "teams"
"""The one stream the types of this module are appended to."""

MAX_NAME = 80
"""The longest workspace, project or group name (characters)."""

PrincipalKind = Literal["user", "group"]


@register
class WorkspaceCreated(Event):
    """``owner`` created workspace ``workspace_id`` named ``name``."""

    event_type = "WorkspaceCreated"

    workspace_id: int
    name: str = Field(max_length=MAX_NAME)
    owner: str


@register
class WorkspaceRenamed(Event):
    """Workspace ``workspace_id`` is named ``name`` from now on."""

    event_type = "WorkspaceRenamed"

    workspace_id: int
    name: str = Field(max_length=MAX_NAME)


@register
class WorkspaceArchived(Event):
    """Workspace ``workspace_id`` was archived (``archived``) or unarchived: an archived one
    takes no new project, experiment or task, and its projects read as archived."""

    event_type = "WorkspaceArchived"

    workspace_id: int
    archived: bool


@register
class WorkspaceDeleted(Event):
    """Workspace ``workspace_id`` was deleted (it held no project: deletion is refused before)."""

    event_type = "WorkspaceDeleted"

    workspace_id: int


@register
class ProjectCreated(Event):
    """``owner`` created project ``project_id`` in workspace ``workspace_id``."""

    event_type = "ProjectCreated"

    project_id: int
    workspace_id: int
    name: str = Field(max_length=MAX_NAME)
    description: str = Field("", max_length=10_000)
    owner: str


@register
class ProjectEdited(Event):
    """Project ``project_id``'s name or description changed (``None``: unchanged)."""

    event_type = "ProjectEdited"

    project_id: int
    name: str | None = Field(None, max_length=MAX_NAME)
    description: str | None = Field(None, max_length=10_000)


@register
class ProjectArchived(Event):
    """Project ``project_id`` was archived (``archived``) or unarchived: an archived one takes
    no new experiment, and none moves in or out of it."""

    event_type = "ProjectArchived"

    project_id: int
    archived: bool


@register
class ProjectDeleted(Event):
    """Project ``project_id`` was deleted (it held no experiment when it was decided; one
    recorded into it in a race is read as being in ``Uncategorized``)."""

    event_type = "ProjectDeleted"

    project_id: int


@register
class GroupCreated(Event):
    """User group ``group_id`` named ``name`` was created with ``members``."""

    event_type = "GroupCreated"

    group_id: int
    name: str = Field(max_length=MAX_NAME)
    members: list[str] = Field(default_factory=list)


@register
class GroupChanged(Event):
    """Group ``group_id`` was renamed (``name``; ``None``: kept) or gained and lost members."""

    event_type = "GroupChanged"

    group_id: int
    name: str | None = Field(None, max_length=MAX_NAME)
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)


@register
class GroupDeleted(Event):
    """Group ``group_id`` was deleted, with every role assigned to it."""

    event_type = "GroupDeleted"

    group_id: int


@register
class RoleAssigned(Event):
    """``role`` was granted to a user (``principal`` is a username) or a group (its id as
    text), on workspace ``workspace_id`` or cluster-wide (``None``)."""

    event_type = "RoleAssigned"

    role: str
    principal_kind: PrincipalKind
    principal: str
    workspace_id: int | None = None


@register
class RoleUnassigned(Event):
    """The grant :class:`RoleAssigned` with the same fields made was withdrawn."""

    event_type = "RoleUnassigned"

    role: str
    principal_kind: PrincipalKind
    principal: str
    workspace_id: int | None = None


@register
class PoolBindingsSet(Event):
    """Resource pool ``pool`` serves only these workspaces from now on (empty: every one, as an
    unbound pool does)."""

    event_type = "PoolBindingsSet"

    pool: str = Field(min_length=1, max_length=200)
    workspace_ids: list[int] = Field(default_factory=list)


TEAMS_FACTS = (
    "WorkspaceCreated",
    "WorkspaceRenamed",
    "WorkspaceArchived",
    "WorkspaceDeleted",
    "ProjectCreated",
    "ProjectEdited",
    "ProjectArchived",
    "ProjectDeleted",
    "GroupCreated",
    "GroupChanged",
    "GroupDeleted",
    "RoleAssigned",
    "RoleUnassigned",
    "PoolBindingsSet",
)
"""Every type of this module (what the teams fold reads)."""
