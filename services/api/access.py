"""Who may read what: the one rule for experiments, their trials and their checkpoints.

- an admin reads everything;
- a user reads the experiments they own, with their trials and checkpoints, and those of the
  workspaces where a role lets them (:func:`events.domain.authorization.permitted`; another
  user's elsewhere: 403);
- a trial token reads its own trial only (and its experiment's searcher state: the best
  validation so far, see :func:`searcher_readable_experiment`);
- the agent token reads what the routes open to agents (agents run every user's trials).

A task (a command, notebook, shell or TensorBoard) asks :func:`check_task`: its owner and admins
may do everything to it, others what a role grants in its workspace (``view_nsc`` to read it,
``update_nsc`` to kill or open it; 403 otherwise).

Registered models ask :func:`check_model_access`, the one place that decides who may read or
change a model and its versions.

Routes ask here (never compare owners themselves), so a new read route cannot forget a case.
Agents, slots, config templates and the user's own identity are shared or personal by design
(``docs/tracking.md``) and need no experiment; changing an experiment is for its owner or an
admin or a role that allows it in the experiment's workspace (:func:`check_experiment`),
changing a template for its creator or an admin.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

from events.domain.aggregates import TaskView
from events.domain.aggregates.teams import Teams
from events.domain.authorization import Permission
from events.domain.names import parse_trial_id, trial_label
from services.api import projections_read as pr
from services.api.auth import Principal, check_trial, principal_of
from services.api.errors import forbidden, not_found
from services.api.routing import store_of
from services.api.teams import allows, authorize, teams_for
from services.api.views import (
    ExperimentView,
    Reader,
    experiment_of,
    load_experiment,
    trial_of,
)
from services.tracker import read as tracker_read

MAX_POLL_SECONDS = 60.0
"""The longest a long poll of an allocation (its preemption signal, its rendezvous) waits, in
seconds."""
POLL_EVERY = 0.2
"""How often such a poll looks again, in seconds."""


async def check_experiment(
    reader: Reader,
    principal: Principal,
    view: ExperimentView,
    permission: Permission = Permission.VIEW_EXPERIMENT,
    *,
    trial_id: int | None = None,
) -> None:
    """Raises 403 unless ``principal`` may act with ``permission`` on experiment ``view`` (or,
    with ``trial_id``, on that trial of it): the agent token reads every experiment, a trial
    token its own trial, a user by :func:`services.api.teams.authorize` in the experiment's
    workspace (its owner and admins without reading the teams)."""
    if principal.kind == "agent" and permission is Permission.VIEW_EXPERIMENT:
        return
    if principal.kind == "trial" and permission is Permission.VIEW_EXPERIMENT:
        if trial_id is None or principal.name != trial_label(trial_id):
            raise forbidden(f"this token is scoped to trial {principal.name}")
        return
    if principal.kind == "user" and (principal.is_admin or principal.name == view.owner):
        return
    if principal.kind != "user":
        raise forbidden("only the experiment's owner or an admin may do this")
    teams = await teams_for(reader)
    authorize(
        teams,
        principal,
        permission,
        workspace_id=teams.workspace_of_project(view.project_id),
        owner=view.owner,
        what=f"experiment {view.experiment_id} is {view.owner}'s",
    )


async def check_task(
    reader: Reader,
    principal: Principal,
    task: TaskView,
    permission: Permission = Permission.VIEW_TASKS,
) -> None:
    """Raises 403 unless user ``principal`` may act with ``permission`` on ``task``: its owner
    and admins without reading the teams, others by :func:`services.api.teams.authorize` in the
    task's workspace (``view_nsc`` reads it; ``update_nsc`` kills it or opens it through the
    proxy, which runs code as its owner)."""
    if principal.kind != "user":
        raise forbidden("only the task's owner, an admin or a role in its workspace may do this")
    if principal.is_admin or principal.name == task.owner:
        return
    teams = await teams_for(reader)
    authorize(
        teams,
        principal,
        permission,
        workspace_id=task.workspace_id,
        owner=task.owner,
        what=f"task {task.task_id} is {task.owner}'s",
    )


async def readable_experiment(
    request: web.Request,
    experiment_id: int,
    *,
    with_trials: bool = False,
) -> ExperimentView:
    """The experiment folded live, if the caller may read it; 404 unknown, 403 not theirs."""
    store = store_of(request)
    view = await load_experiment(store, experiment_id, with_trials=with_trials)
    await check_experiment(store, principal_of(request), view)
    return view


async def searcher_readable_experiment(
    request: web.Request, experiment_id: int, *, with_trials: bool = False
) -> ExperimentView:
    """The experiment, if the caller may read its searcher state: whoever may read the
    experiment, and the trial token of any of its trials (a trial asks how the search is going,
    ``get_experiment_best_validation()``); 404 unknown, 403 otherwise."""
    store = store_of(request)
    view = await load_experiment(store, experiment_id, with_trials=with_trials)
    principal = principal_of(request)
    if principal.kind == "trial":
        if await experiment_of(store, parse_trial_id(principal.name)) != experiment_id:
            raise forbidden(f"this token is scoped to trial {principal.name}")
        return view
    await check_experiment(store, principal, view)
    return view


async def readable_trial(request: web.Request, trial_id: int) -> ExperimentView:
    """The experiment of ``trial_id`` (with only that trial requested), if the caller may read
    the trial; 404 for an unknown experiment or trial, 403 for one that is not theirs."""
    store = store_of(request)
    view = await load_experiment(store, await experiment_of(store, trial_id), trial_id=trial_id)
    await check_experiment(store, principal_of(request), view, trial_id=trial_id)
    if trial_id not in view.trials:
        raise not_found(f"no trial {trial_id}")
    return view


async def readable_checkpoint(
    request: web.Request, uuid: str
) -> tuple[dict[str, Any], ExperimentView]:
    """A checkpoint's row and its experiment, if the caller may read it; 404 unknown, 403 not
    theirs. The row is the projection's, whose first report of a uuid wins, as ownership
    does (:mod:`events.domain.checkpoints`)."""
    if "\x00" in uuid or len(uuid) > 500:
        raise not_found(f"no checkpoint {uuid!r}")
    store = store_of(request)
    row = await pr.read_row(store, tracker_read.checkpoint, uuid)
    if row is None:
        raise not_found(f"no checkpoint {uuid}")
    view = await load_experiment(store, int(row["experiment_id"]), with_trials=False)
    await check_experiment(store, principal_of(request), view, trial_id=int(row["trial_id"]))
    return row, view


ModelAction = Literal["read", "create", "change", "delete"]

_MODEL_PERMISSIONS: dict[str, Permission] = {
    "read": Permission.VIEW_MODEL_REGISTRY,
    "create": Permission.CREATE_MODEL_REGISTRY,
    "change": Permission.EDIT_MODEL_REGISTRY,
    "delete": Permission.DELETE_MODEL_REGISTRY,
}
"""What a caller does to the registry: read models and versions, create a model, change one
(edit, archive, delete it, and register, edit or delete its versions), or take it out of its
workspace (the source side of a move)."""


def model_visible(teams: Teams, principal: Principal, *, workspace_id: int, owner: str) -> bool:
    """Whether ``principal`` may read a model of ``owner`` in workspace ``workspace_id`` (what
    the model list keeps; :func:`check_model_access` with ``"read"`` says the same)."""
    return allows(
        teams,
        principal,
        Permission.VIEW_MODEL_REGISTRY,
        workspace_id=workspace_id,
        owner=owner or None,
    )


async def check_model_access(
    reader: Reader,
    principal: Principal,
    action: ModelAction,
    *,
    workspace_id: int,
    owner: str = "",
    creator: str = "",
) -> None:
    """Raises 403 unless ``principal`` may ``action`` a model owned by ``owner`` (for a
    version, created by ``creator``) in workspace ``workspace_id``.

    The roles' rule (:func:`events.domain.authorization.permitted`) in the model's workspace:
    an admin may do everything; the model's owner reads, changes and deletes it wherever it is;
    every user reads the default workspace's models and may create one there; elsewhere a role
    granting the action's permission there is needed (a Viewer reads, an Editor also creates,
    changes and deletes). A version's creator changes that version. Registering a version also
    needs the checkpoint to be readable by the caller (:func:`readable_checkpoint`), which its
    route asks separately.
    """
    if principal.kind != "user":
        raise forbidden("only users use the model registry")
    if principal.is_admin:
        return
    if action == "change" and creator and principal.name == creator:
        return
    teams = await teams_for(reader)
    authorize(
        teams,
        principal,
        _MODEL_PERMISSIONS[action],
        workspace_id=workspace_id,
        owner=owner or None,
        what=f"the model is {owner}'s" if owner else "",
    )


def allocation_of_path(request: web.Request) -> tuple[str, int]:
    """The allocation of the path and its trial's id (a trial token: its own trial's only, 403
    otherwise)."""
    allocation_id = request.match_info["allocation_id"]
    trial_id = trial_of(allocation_id)
    check_trial(principal_of(request), trial_id)
    return allocation_id, trial_id
