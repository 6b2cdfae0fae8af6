"""Starting a TensorBoard: ``POST /api/v1/tensorboards`` over experiments and trials.

The caller must be allowed to read every experiment and trial it names, exactly as reading it
would require (:mod:`services.api.access`: 404 unknown, 403 another user's); the request records
each experiment's trials (all of them, or the named ones) and where its storage is, credentials
masked. The task is then a task like any other (:mod:`services.api.routes_tasks`): listed,
killed, its output read, reached through the proxy once ready.
"""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from events.domain.aggregates import TaskView
from events.domain.config.secrets import mask_secrets
from events.domain.deciders.task import (
    MAX_TENSORBOARD_EXPERIMENTS,
    MAX_TENSORBOARD_TRIALS,
    StartTensorboard,
    decide_start_tensorboard,
)
from events.domain.types.task import TensorboardSource
from services.api.access import check_experiment
from services.api.auth import principal_of
from services.api.errors import not_found, parse, read_json
from services.api.routes_tasks import (
    WORKSPACE_FIELD,
    TaskDetail,
    WorkspaceRef,
    new_task_id,
    submit_decided,
    task_workspace,
)
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import current_teams
from services.api.views import ExperimentView, experiment_of, load_experiment

log = structlog.get_logger("api")
routes = RouteTable("tensorboards")


class CreateTensorboardBody(BaseModel):
    """A TensorBoard to start: every trial of ``experiment_ids`` and the trials ``trial_ids``
    (of any experiment the caller may read), its ``config`` (the command config's fields; no
    slots unless ``resources.slots`` asks for some) and the ``workspace`` it goes in."""

    model_config = ConfigDict(extra="forbid")

    experiment_ids: list[int] = Field(default_factory=list, max_length=MAX_TENSORBOARD_EXPERIMENTS)
    trial_ids: list[int] = Field(default_factory=list, max_length=MAX_TENSORBOARD_TRIALS)
    config: dict[str, Any] = Field(default_factory=dict)
    workspace: WorkspaceRef | None = WORKSPACE_FIELD


async def _readable(
    request: web.Request, experiment_id: int, seen: dict[int, ExperimentView]
) -> ExperimentView:
    """The experiment with its trials, if the caller may read it (folded once per request)."""
    view = seen.get(experiment_id)
    if view is None:
        view = await load_experiment(store_of(request), experiment_id, with_trials=True)
        await check_experiment(store_of(request), principal_of(request), view)
        seen[experiment_id] = view
    return view


async def resolve_sources(
    request: web.Request, experiment_ids: list[int], trial_ids: list[int]
) -> tuple[TensorboardSource, ...]:
    """The sources of a TensorBoard: one per experiment, in the order first named, every trial
    of an experiment named whole and the named trials of the others.

    Raises:
        ApiError: 404 for an unknown experiment or trial, 403 for one the caller may not read.
    """
    seen: dict[int, ExperimentView] = {}
    whole: list[int] = []
    for experiment_id in experiment_ids:
        if experiment_id < 1:
            raise not_found(f"no experiment {experiment_id}")
        await _readable(request, experiment_id, seen)
        if experiment_id not in whole:
            whole.append(experiment_id)
    picked: dict[int, list[int]] = {}
    for trial_id in trial_ids:
        if trial_id < 1:
            raise not_found(f"no trial {trial_id}")
        experiment_id = await experiment_of(store_of(request), trial_id)
        view = await _readable(request, experiment_id, seen)
        if trial_id not in view.trials:
            raise not_found(f"no trial {trial_id}")
        if experiment_id not in whole and trial_id not in picked.get(experiment_id, []):
            picked.setdefault(experiment_id, []).append(trial_id)
    order = list(dict.fromkeys([*whole, *picked]))
    return tuple(
        TensorboardSource(
            experiment_id=experiment_id,
            trial_ids=None if experiment_id in whole else sorted(picked[experiment_id]),
            storage=mask_secrets(seen[experiment_id].config).get("checkpoint_storage"),
        )
        for experiment_id in order
    )


@routes.post("/api/v1/tensorboards", allow=USERS, body=CreateTensorboardBody, response=TaskDetail)
async def create_tensorboard(request: web.Request) -> web.Response:
    """Appends TaskRequested (kind ``tensorboard``) in ``workspace`` over experiments and trials
    the caller may read (404 unknown, 403 another user's; 400 for none or too many)."""
    principal = principal_of(request)
    body = parse(CreateTensorboardBody, await read_json(request))
    workspace_id = task_workspace(await current_teams(store_of(request)), body.workspace)
    sources = await resolve_sources(request, body.experiment_ids, body.trial_ids)
    command = StartTensorboard(
        task_id=new_task_id(),
        owner=principal.name,
        sources=sources,
        config=body.config,
        workspace_id=workspace_id,
    )
    decision = decide_start_tensorboard(TaskView(command.task_id), command)
    return await submit_decided(request, command.task_id, None, decision)
