"""Experiments as read: the list, one experiment (live, or as it was at a past position), and
an experiment's trials and checkpoints."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, Field, field_validator

from events.domain.config import ConfigWarning
from services.api import history
from services.api import projections_read as pr
from services.api.access import readable_experiment
from services.api.auth import principal_of
from services.api.errors import parse
from services.api.experiment_commands import experiment_id_of
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import current_teams, load_teams, placement, visible_projects
from services.api.views import ExperimentView, load_experiment
from services.tracker import read as tracker_read

routes = RouteTable("experiments")


class ExperimentsQuery(pr.PageQuery):
    """Filters and order of the experiment list (a user sees their own, and others' in the
    workspaces where a role lets them)."""

    state: str | None = Field(None, description="comma-separated states, e.g. ACTIVE,PAUSED")
    owner: str | None = Field(None, max_length=200)
    workspace_id: int | None = Field(None, ge=1, description="only this workspace's")
    project_id: int | None = Field(None, ge=1, description="only this project's")
    archived: Literal["false", "true", "all"] = "false"
    name: str | None = Field(None, max_length=500, description="substring of the name")
    order_by: Literal["id", "-id"] = "-id"

    _states = field_validator("state")(pr.check_states)


class ExperimentsResponse(BaseModel):
    """A page of experiments."""

    experiments: list[pr.ExperimentSummary]
    pagination: pr.Pagination


class TrialLineage(BaseModel):
    """A trial cloned from another by the search (population-based training)."""

    trial_id: int
    parent_trial_id: int | None
    round: int | None
    change: dict[str, Any]
    warm_start_checkpoint: str | None
    warm_start_steps: int


class ExperimentDetail(pr.ExperimentSummary):
    """The live fold of the experiment's stream plus its projection and its trials; ``lineage``
    lists the trials the search cloned from others, in request order."""

    code_ref: str | None
    config: dict[str, Any]
    description: str | None
    labels: list[Any]
    priority: int | None = None
    weight: float | None = None
    max_slots: int | None = None
    trials: list[pr.TrialSummary]
    warnings: list[ConfigWarning] = []
    at: int | None = Field(None, description="the log position of a past state (``?at=``)")
    submitted_position: int | None = Field(None, description="the log position of its submission")
    position: int | None = Field(
        None, description="the log's head when the present state was read (absent with ``at``)"
    )
    lineage: list[TrialLineage] = []
    external_id: str | None = Field(
        None, description="an unmanaged experiment's name given by its script (core_v2)"
    )


class TrialsQuery(pr.PageQuery):
    """Filter and order of an experiment's trials."""

    state: str | None = Field(None, description="comma-separated states")
    order_by: Literal["id", "best"] = "id"
    at: str | None = Field(None, description=history.AT_DESCRIPTION)

    _states = field_validator("state")(pr.check_states)


class TrialsResponse(BaseModel):
    """A page of an experiment's trials."""

    trials: list[pr.TrialSummary]
    pagination: pr.Pagination


class CheckpointsQuery(pr.PageQuery):
    """Which of an experiment's checkpoints, in which order (best metric or most steps first)."""

    state: Literal["COMPLETED", "DELETED", "all"] = "COMPLETED"
    sort_by: Literal["metric", "steps"] = "metric"


class CheckpointsResponse(BaseModel):
    """A page of an experiment's checkpoints."""

    checkpoints: list[pr.Checkpoint]
    pagination: pr.Pagination


async def _visible(request: web.Request, *, with_trials: bool = False) -> ExperimentView:
    """The experiment of the path, folded live; 404 unknown, 403 another user's."""
    return await readable_experiment(request, experiment_id_of(request), with_trials=with_trials)


@routes.get(
    "/api/v1/experiments", allow=USERS, query=ExperimentsQuery, response=ExperimentsResponse
)
async def list_experiments(request: web.Request) -> web.Response:
    """Experiments from the projection, filtered and paginated (a user sees their own and
    those of the workspaces where a role lets them see others')."""
    principal = principal_of(request)
    query = parse(ExperimentsQuery, dict(request.query))
    store = store_of(request)
    teams = await current_teams(store)
    visible = visible_projects(teams, principal)
    projects: list[int] | None = None
    if query.project_id is not None:
        projects = [query.project_id]
    elif query.workspace_id is not None:
        projects = [p.project_id for p in teams.projects_of(query.workspace_id)] or [0]
    rows, total = await pr.read_page(
        store,
        tracker_read.list_experiments,
        states=pr.states_of(query.state),
        owner=query.owner,
        projects=projects,
        visible_to=None if visible is None else (principal.name, visible),
        archived=None if query.archived == "all" else query.archived == "true",
        name=query.name,
        descending=query.order_by == "-id",
        limit=query.limit,
        offset=query.offset,
    )
    await pr.with_progress(store, rows)
    for row in rows:
        row.update(placement(teams, int(row["project_id"])))
    return web.json_response({"experiments": rows, "pagination": pr.pagination(query, total)})


@routes.get(
    "/api/v1/experiments/{experiment_id}",
    allow=USERS,
    query=history.AtQuery,
    response=ExperimentDetail,
)
async def get_experiment(request: web.Request) -> web.Response:
    """The experiment folded from its stream (state, owner, config) with its projection's
    figures and its trials."""
    view = await _visible(request, with_trials=True)
    store = store_of(request)
    at = await history.position_at(store, request)
    if at is not None:
        past = await load_experiment(store, view.experiment_id, at=at)
        trials = await history.trial_summaries(store, past, at)
        return web.json_response(
            history.experiment_detail(past, trials, at)
            | {"lineage": _lineage(past)}
            | placement(await load_teams(store, at=at), past.project_id)
        )
    body = view.describe()
    body.update(placement(await current_teams(store), view.project_id))
    body["position"] = await store.head()
    row = await pr.experiment_row(store, view.experiment_id) or {}
    searcher = view.searcher
    resources = view.config.get("resources")
    body.update(
        {
            "searcher_name": row.get("searcher_name", searcher.get("name")),
            "max_trials": row.get("max_trials", searcher.get("max_trials")),
            "best_trial_id": row.get("best_trial_id"),
            "best_metric": row.get("best_metric"),
            "resource_pool": row.get(
                "resource_pool",
                resources.get("resource_pool") if isinstance(resources, dict) else None,
            ),
            "progress": row.get("progress"),
        }
    )
    projected, _ = await pr.read_page(store, tracker_read.list_trials, view.experiment_id)
    by_id = {t["trial_id"]: t for t in projected}
    body["trials"] = [by_id.get(tid) or view.requested_trial(tid) for tid in view.trials]
    body["lineage"] = _lineage(view)
    return web.json_response(body)


def _lineage(view: ExperimentView) -> list[dict[str, Any]]:
    """Which trial was cloned from which (PBT), with the change and the warm-start checkpoint."""
    return [
        {
            "trial_id": tid,
            "parent_trial_id": req.parent_trial_id,
            "round": req.round,
            "change": req.change,
            "warm_start_checkpoint": req.warm_start_checkpoint,
            "warm_start_steps": req.warm_start_steps,
        }
        for tid, req in view.trials.items()
        if req.parent_trial_id is not None or req.warm_start_checkpoint is not None
    ]


@routes.get(
    "/api/v1/experiments/{experiment_id}/trials",
    allow=USERS,
    query=TrialsQuery,
    response=TrialsResponse,
)
async def list_experiment_trials(request: web.Request) -> web.Response:
    """An experiment's trials from the projection, by id or best metric first."""
    query = parse(TrialsQuery, dict(request.query))
    view = await _visible(request)
    store = store_of(request)
    at = await history.position_at(store, request)
    if at is not None:
        past = await load_experiment(store, view.experiment_id, at=at)
        rows, total = history.trial_page(
            past,
            await history.trial_summaries(store, past, at),
            states=pr.states_of(query.state),
            best_first=query.order_by == "best",
            limit=query.limit,
            offset=query.offset,
        )
        return web.json_response({"trials": rows, "pagination": pr.pagination(query, total)})
    rows, total = await pr.read_page(
        store_of(request),
        tracker_read.list_trials,
        view.experiment_id,
        states=pr.states_of(query.state),
        best_first=query.order_by == "best",
        smaller_is_better=view.smaller_is_better,
        limit=query.limit,
        offset=query.offset,
    )
    return web.json_response({"trials": rows, "pagination": pr.pagination(query, total)})


@routes.get(
    "/api/v1/experiments/{experiment_id}/checkpoints",
    allow=USERS,
    query=CheckpointsQuery,
    response=CheckpointsResponse,
)
async def list_experiment_checkpoints(request: web.Request) -> web.Response:
    """An experiment's checkpoints from the projection, best searcher metric (or most steps)
    first."""
    query = parse(CheckpointsQuery, dict(request.query))
    view = await _visible(request)
    rows, total = await pr.read_page(
        store_of(request),
        tracker_read.list_checkpoints,
        experiment_id=view.experiment_id,
        state=query.state,
        by_metric=query.sort_by == "metric",
        smaller_is_better=view.smaller_is_better,
        limit=query.limit,
        offset=query.offset,
    )
    return web.json_response({"checkpoints": rows, "pagination": pr.pagination(query, total)})
