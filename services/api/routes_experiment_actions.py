"""A user's actions on an experiment: pause, activate, cancel and kill, archive and unarchive,
and delete (each owner or admin, each decided against the experiment's stream)."""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel

from events.domain import lifecycle
from events.domain.authorization import Permission
from events.domain.deciders.experiment import (
    TRANSITIONS,
    Action,
    ChangeState,
    DeleteExperiment,
    SetArchived,
    decide_archived,
    decide_delete,
    decide_state,
)
from events.domain.model_registry import lock_registry, registrations
from events.log.envelope import Event
from events.log.store import Transaction
from services.api.auth import principal_of
from services.api.errors import parse
from services.api.errors import read_json as read_json_body
from services.api.experiment_commands import (
    act_on_experiment,
    decide_on_experiment,
    experiment_id_of,
)
from services.api.inbox import in_transaction
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import ExperimentView

log = structlog.get_logger("api")
routes = RouteTable("experiments")


class ActionBody(BaseModel):
    """An optional reason recorded with a state change."""

    reason: str = ""


class ActionResponse(BaseModel):
    """The experiment's state after the action, and whether it changed."""

    id: int
    state: str
    changed: bool


class EmptyBody(BaseModel):
    """No fields."""


class ArchiveResponse(BaseModel):
    """Whether the experiment is archived now, and whether this call changed it."""

    id: int
    archived: bool
    changed: bool


class DeleteResponse(BaseModel):
    """The experiment is being deleted (the tracker removes its checkpoints, then marks it
    DELETED)."""

    id: int
    state: str
    changed: bool


def _archive_handler(archived: bool) -> Any:
    verb = "archive" if archived else "unarchive"

    async def handler(request: web.Request) -> web.Response:
        principal = principal_of(request)
        experiment_id = experiment_id_of(request)
        parse(EmptyBody, await read_json_body(request))

        command = SetArchived(archived=archived, actor=principal.name)
        _, events = await act_on_experiment(
            request, principal, experiment_id, lambda view: decide_archived(view, command)
        )
        if events:
            log.info(f"experiment {verb}d", experiment_id=experiment_id)
        return web.json_response(
            {"id": experiment_id, "archived": archived, "changed": bool(events)}
        )

    handler.__name__ = f"{verb}_experiment"
    handler.__doc__ = f"Appends ExperimentArchived (owner or admin; 409 unless terminal): {verb}."
    return handler


for _archived in (True, False):
    routes.post(
        f"/api/v1/experiments/{{experiment_id}}/{'archive' if _archived else 'unarchive'}",
        allow=USERS,
        body=EmptyBody,
        response=ArchiveResponse,
    )(_archive_handler(_archived))


@routes.add("DELETE", "/api/v1/experiments/{experiment_id}", allow=USERS, response=DeleteResponse)
async def delete_experiment(request: web.Request) -> web.Response:
    """Moves a terminal (or DELETE_FAILED) experiment to DELETING; the tracker deletes its
    checkpoints and marks it DELETED (owner or admin; 409 otherwise, and while one of its
    checkpoints is registered as a model version, naming the model and version)."""
    principal = principal_of(request)
    experiment_id = experiment_id_of(request)

    async def work(tx: Transaction) -> tuple[ExperimentView, list[Event]]:
        # Under the registry lock: no version of its checkpoints can be registered between
        # this read and the commit (events.domain.model_registry).
        await lock_registry(tx)
        kept = await registrations(tx, experiment_id=experiment_id)
        command = DeleteExperiment(
            actor=principal.name, registered=tuple(r.describe() for r in kept)
        )
        return await decide_on_experiment(
            tx,
            principal,
            experiment_id,
            lambda view: decide_delete(view, command),
            permission=Permission.DELETE_EXPERIMENT,
        )

    view, events = await in_transaction(store_of(request), work)
    if events:
        log.info("experiment deleting", experiment_id=experiment_id, actor=principal.name)
    state = lifecycle.DELETING if events else view.state
    return web.json_response({"id": experiment_id, "state": state, "changed": bool(events)})


def _action_handler(action: Action) -> Any:
    target, _ = TRANSITIONS[action]

    async def handler(request: web.Request) -> web.Response:
        principal = principal_of(request)
        experiment_id = experiment_id_of(request)
        body = parse(ActionBody, await read_json_body(request))
        command = ChangeState(action=action, actor=principal.name, reason=body.reason)
        _, events = await act_on_experiment(
            request, principal, experiment_id, lambda view: decide_state(view, command)
        )
        if events:
            log.info("experiment state changed", experiment_id=experiment_id, state=target)
        return web.json_response({"id": experiment_id, "state": target, "changed": bool(events)})

    handler.__name__ = f"{action}_experiment"
    handler.__doc__ = (
        f"Moves the experiment to {target} (owner or admin; 409 when not allowed, and for an "
        "unmanaged experiment)."
    )
    return handler


for _action in TRANSITIONS:
    routes.post(
        f"/api/v1/experiments/{{experiment_id}}/{_action}",
        allow=USERS,
        body=ActionBody,
        response=ActionResponse,
    )(_action_handler(_action))
