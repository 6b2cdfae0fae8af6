"""Who may do what: roles, their permissions, and the one rule every route asks.

A role is a named set of permissions (Determined's built-in roles, with their names and
meanings). It is granted to a user or a group, either cluster-wide or on one workspace
(``RoleAssigned``); grants only add up, nothing denies. :func:`permitted` decides an action from
the caller, the permission it needs, and the workspace and owner of the object it touches:

1. an admin may do everything (the ``admin`` flag is ClusterAdmin granted cluster-wide);
2. a user may do everything to what they own (:data:`OWNER_PERMISSIONS`; an experiment, a
   task, a model of theirs), as before roles existed, so a single-user cluster sees no change;
3. every user may create in and see the default workspace (:data:`EVERYONE_IN_DEFAULT`), but
   not see others' work there;
4. otherwise a grant to the user or one of their groups, cluster-wide or on the object's
   workspace, must hold the permission.

A role holding a cluster-only permission (:data:`CLUSTER_ONLY`) can only be granted
cluster-wide. Pure: no I/O; the state is :class:`events.domain.aggregates.teams.Teams`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from events.domain.aggregates.teams import Teams


class Permission(StrEnum):
    """What an action needs (Determined's permission names, lower-cased)."""

    VIEW_EXPERIMENT = "view_experiment"
    CREATE_EXPERIMENT = "create_experiment"
    UPDATE_EXPERIMENT = "update_experiment"
    DELETE_EXPERIMENT = "delete_experiment"
    VIEW_TASKS = "view_nsc"
    CREATE_TASKS = "create_nsc"
    UPDATE_TASKS = "update_nsc"
    VIEW_PROJECT = "view_project"
    CREATE_PROJECT = "create_project"
    UPDATE_PROJECT = "update_project"
    DELETE_PROJECT = "delete_project"
    VIEW_WORKSPACE = "view_workspace"
    UPDATE_WORKSPACE = "update_workspace"
    DELETE_WORKSPACE = "delete_workspace"
    CREATE_WORKSPACE = "create_workspace"
    ASSIGN_ROLES = "assign_roles"
    VIEW_MODEL_REGISTRY = "view_model_registry"
    CREATE_MODEL_REGISTRY = "create_model_registry"
    EDIT_MODEL_REGISTRY = "edit_model_registry"
    DELETE_MODEL_REGISTRY = "delete_model_registry"
    DELETE_OTHER_USER_MODEL_REGISTRY = "delete_other_user_model_registry"
    VIEW_WEBHOOKS = "view_webhooks"
    EDIT_WEBHOOKS = "edit_webhooks"
    ADMINISTRATE_USER = "administrate_user"
    UPDATE_GROUP = "update_group"
    VIEW_CLUSTER = "view_cluster"
    """Cluster operations: usage of everyone, the audit trail, agents' control."""
    BIND_POOLS = "modify_rp_workspace_bindings"


P = Permission

CLUSTER_ONLY: frozenset[Permission] = frozenset(
    {P.CREATE_WORKSPACE, P.ADMINISTRATE_USER, P.UPDATE_GROUP, P.VIEW_CLUSTER, P.BIND_POOLS}
)
"""Permissions only a cluster-wide grant can give (a role holding one is never granted on a
workspace)."""

_VIEW = frozenset(
    {P.VIEW_EXPERIMENT, P.VIEW_TASKS, P.VIEW_PROJECT, P.VIEW_WORKSPACE, P.VIEW_MODEL_REGISTRY}
)
_VIEW_ALL = _VIEW | {P.VIEW_WEBHOOKS}
_EDIT = _VIEW_ALL | {
    P.CREATE_EXPERIMENT,
    P.UPDATE_EXPERIMENT,
    P.DELETE_EXPERIMENT,
    P.CREATE_TASKS,
    P.UPDATE_TASKS,
    P.CREATE_PROJECT,
    P.UPDATE_PROJECT,
    P.CREATE_MODEL_REGISTRY,
    P.EDIT_MODEL_REGISTRY,
    P.DELETE_MODEL_REGISTRY,
    P.EDIT_WEBHOOKS,
}

ROLES: dict[str, frozenset[Permission]] = {
    "ClusterAdmin": frozenset(Permission),
    "WorkspaceAdmin": _EDIT
    | {
        P.DELETE_PROJECT,
        P.UPDATE_WORKSPACE,
        P.DELETE_WORKSPACE,
        P.ASSIGN_ROLES,
        P.DELETE_OTHER_USER_MODEL_REGISTRY,
    },
    "WorkspaceCreator": frozenset({P.CREATE_WORKSPACE}),
    "Editor": _EDIT,
    "EditorRestricted": _EDIT - {P.CREATE_TASKS, P.UPDATE_TASKS},
    "Viewer": _VIEW_ALL,
    "ModelRegistryViewer": frozenset({P.VIEW_MODEL_REGISTRY}),
}
"""The built-in roles (Determined's names and meanings) and what each permits."""

ROLE_DESCRIPTIONS: dict[str, str] = {
    "ClusterAdmin": "everything, everywhere",
    "WorkspaceAdmin": "everything in its workspace, including its members' roles",
    "WorkspaceCreator": "create workspaces (and administer the ones it creates)",
    "Editor": "see, create, change and delete experiments, tasks, projects and models",
    "EditorRestricted": "an Editor that starts no notebooks, shells, commands or TensorBoards",
    "Viewer": "see everything in its workspace, change nothing",
    "ModelRegistryViewer": "see the model registry only",
}

OWNER_PERMISSIONS: frozenset[Permission] = frozenset(
    {
        P.VIEW_EXPERIMENT,
        P.UPDATE_EXPERIMENT,
        P.DELETE_EXPERIMENT,
        P.VIEW_TASKS,
        P.UPDATE_TASKS,
        P.EDIT_MODEL_REGISTRY,
        P.DELETE_MODEL_REGISTRY,
        P.VIEW_MODEL_REGISTRY,
    }
)
"""What a user may do to an object of their own, whatever their roles."""

EVERYONE_IN_DEFAULT: frozenset[Permission] = frozenset(
    {
        P.VIEW_WORKSPACE,
        P.VIEW_PROJECT,
        P.CREATE_EXPERIMENT,
        P.CREATE_TASKS,
        P.VIEW_MODEL_REGISTRY,
        P.CREATE_MODEL_REGISTRY,
    }
)
"""What every user may do in the default workspace (``Uncategorized``)."""

DEFAULT_WORKSPACE_ID = 1
"""The workspace that exists without a fact and holds what names none."""
DEFAULT_PROJECT_ID = 1
"""Its project, which holds the experiments that name none."""
DEFAULT_NAME = "Uncategorized"
"""The name of both."""


def cluster_wide(role: str) -> bool:
    """Whether ``role`` can only be granted cluster-wide (it holds a cluster-only permission)."""
    return bool(ROLES.get(role, frozenset()) & CLUSTER_ONLY)


def permitted(
    teams: Teams,
    user: str,
    permission: Permission,
    *,
    admin: bool = False,
    workspace_id: int | None = None,
    owner: str | None = None,
) -> bool:
    """Whether ``user`` may act with ``permission`` on an object of ``owner`` in workspace
    ``workspace_id`` (``None``: a cluster-wide action), by the rule in this module's docstring."""
    if admin:
        return True
    if owner is not None and owner == user and permission in OWNER_PERMISSIONS:
        return True
    if workspace_id == DEFAULT_WORKSPACE_ID and permission in EVERYONE_IN_DEFAULT:
        return True
    return permission in teams.permissions_of(user, workspace_id)


__all__ = [
    "CLUSTER_ONLY",
    "DEFAULT_NAME",
    "DEFAULT_PROJECT_ID",
    "DEFAULT_WORKSPACE_ID",
    "EVERYONE_IN_DEFAULT",
    "OWNER_PERMISSIONS",
    "ROLES",
    "ROLE_DESCRIPTIONS",
    "Permission",
    "cluster_wide",
    "permitted",
]
