"""The model registry: models (create, list, read, edit, archive, delete) and their numbered
versions, each pointing at a COMPLETED checkpoint (register, list, read, edit, delete).

Every change is decided by :mod:`events.domain.deciders.model` under the registry lock
(:mod:`events.domain.model_registry`), which orders registrations against checkpoint
deletions; who may do what is :func:`services.api.access.check_model_access`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates import ModelView
from events.domain.deciders import Decision
from events.domain.deciders.model import (
    CreateModel,
    DeleteModel,
    DeleteVersion,
    EditModel,
    EditVersion,
    RegisterVersion,
    SetModelArchived,
    decide_create_model,
    decide_delete_model,
    decide_delete_version,
    decide_edit_model,
    decide_edit_version,
    decide_model_archived,
    decide_register_version,
)
from events.domain.lifecycle import DELETED, DELETING
from events.domain.model_registry import (
    load_model,
    lock_registry,
    model_named,
    next_model_id,
)
from events.domain.names import experiment_stream, model_stream
from events.domain.types import CheckpointsDeleted
from events.domain.types.model import DEFAULT_WORKSPACE
from events.log.envelope import Event
from events.log.store import Transaction
from services.api import projections_read as pr
from services.api.access import check_model_access, readable_checkpoint
from services.api.auth import principal_of
from services.api.decided import append_accepted
from services.api.errors import bad_request, parse, read_json
from services.api.inbox import in_transaction
from services.api.model_views import (
    all_models,
    describe_model,
    describe_version,
    model_of_path,
    version_number,
    version_of_path,
)
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import load_experiment
from services.tracker import read as tracker_read

log = structlog.get_logger("api")
routes = RouteTable("models")

Text = Field(default="", max_length=100_000)


class Model(BaseModel):
    """A registered model."""

    id: int
    name: str
    description: str
    labels: list[str]
    metadata: dict[str, Any]
    notes: str
    username: str = Field(description="who created it (its owner)")
    workspace: str
    archived: bool
    num_versions: int
    creation_time: str | None
    last_updated_time: str | None


class ModelsResponse(BaseModel):
    """The models, in the order asked for."""

    models: list[Model]


class ModelsQuery(BaseModel):
    """Filter and order of the model list."""

    name: str | None = Field(None, max_length=1000, description="names containing this")
    label: str | None = Field(None, max_length=1000, description="models with this label")
    archived: Literal["true", "false", "all"] = "all"
    workspace_names: str | None = Field(
        None, max_length=10_000, description="comma-separated workspace names"
    )
    sort_by: Literal["name", "description", "creation_time", "last_updated_time"] = (
        "last_updated_time"
    )
    order_by: Literal["asc", "desc"] = "asc"


class CheckpointSummary(BaseModel):
    """The checkpoint a version points at (state, steps and time from the tracker's projection;
    null until it has the row)."""

    uuid: str
    experiment_id: int
    trial_id: int
    state: str | None
    steps_completed: int | None
    reported_at: str | None


class ModelRef(BaseModel):
    """The model a version belongs to."""

    id: int
    name: str


class ModelVersion(BaseModel):
    """One version of a model."""

    model: ModelRef
    version: int
    checkpoint: CheckpointSummary
    name: str
    comment: str
    labels: list[str]
    metadata: dict[str, Any]
    notes: str
    username: str = Field(description="who registered it")
    creation_time: str | None
    last_updated_time: str | None


class ModelVersionsResponse(BaseModel):
    """A model and its versions, oldest first."""

    model: Model
    model_versions: list[ModelVersion]


class CreateModelBody(BaseModel):
    """A new model."""

    model_config = {"extra": "forbid"}

    name: str = Field(max_length=1000)
    description: str = Text
    labels: list[str] = Field(default_factory=list, max_length=1000)
    metadata: dict[str, Any] = Field(default_factory=dict)
    notes: str = Text
    workspace_name: str | None = Field(
        None, max_length=1000, description=f"only {DEFAULT_WORKSPACE!r} for now"
    )


class PatchModelBody(BaseModel):
    """The fields to change (an absent one stays as it is)."""

    model_config = {"extra": "forbid"}

    name: str | None = Field(None, max_length=1000)
    description: str | None = Field(None, max_length=100_000)
    labels: list[str] | None = Field(None, max_length=1000)
    metadata: dict[str, Any] | None = None
    notes: str | None = Field(None, max_length=100_000)


class RegisterVersionBody(BaseModel):
    """The checkpoint to register, and the version's own fields."""

    model_config = {"extra": "forbid"}

    checkpoint_uuid: str = Field(min_length=1, max_length=128)
    name: str = Field(default="", max_length=1000)
    comment: str = Text
    labels: list[str] = Field(default_factory=list, max_length=1000)
    metadata: dict[str, Any] = Field(default_factory=dict)
    notes: str = Text


class PatchVersionBody(BaseModel):
    """The version's fields to change; its checkpoint never changes."""

    model_config = {"extra": "forbid"}

    name: str | None = Field(None, max_length=1000)
    comment: str | None = Field(None, max_length=100_000)
    labels: list[str] | None = Field(None, max_length=1000)
    metadata: dict[str, Any] | None = None
    notes: str | None = Field(None, max_length=100_000)
    checkpoint_uuid: str | None = Field(
        None, max_length=128, description="refused unless it is the version's own"
    )


class EmptyBody(BaseModel):
    """No fields."""

    model_config = {"extra": "forbid"}


class DeletedResponse(BaseModel):
    """What was deleted."""

    model: str
    version: int | None = None


def _check_workspace(name: str | None) -> str:
    if name is None or name == DEFAULT_WORKSPACE:
        return DEFAULT_WORKSPACE
    raise bad_request(
        f"workspace_name: no workspace {name[:100]!r}; models are in {DEFAULT_WORKSPACE!r}",
        path="workspace_name",
    )


async def _change(
    request: web.Request,
    decide: Callable[[ModelView], Decision],
    *,
    version_ref: str | None = None,
) -> tuple[ModelView, list[Event]]:
    """Folds the model of the path under the registry lock, lets its owner (or an admin; for a
    version, also its creator) act, and appends what ``decide`` decides."""
    principal = principal_of(request)
    ref = request.match_info["name"]

    async def work(tx: Transaction) -> tuple[ModelView, list[Event]]:
        await lock_registry(tx)
        view = await model_of_path(tx, ref)
        creator = version_of_path(view, version_ref).creator if version_ref is not None else ""
        await check_model_access(tx, principal, "change", owner=view.owner, creator=creator)
        events = await append_accepted(
            tx,
            model_stream(view.model_id),
            decide(view),
            expected_version=view.version,
            actor=principal.name,
        )
        return view, events

    return await in_transaction(store_of(request), work)


async def _described(request: web.Request, model_id: int) -> dict[str, Any]:
    return describe_model(await load_model(store_of(request), model_id))


async def _versions(request: web.Request, view: ModelView) -> list[dict[str, Any]]:
    store = store_of(request)
    out = []
    for number in sorted(view.versions):
        version = view.versions[number]
        row = await pr.read_row(store, tracker_read.checkpoint, version.checkpoint_uuid)
        out.append(describe_version(view, version, row))
    return out


_SORT_KEYS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "name": lambda m: m["name"],
    "description": lambda m: m["description"],
    "creation_time": lambda m: m["creation_time"] or "",
    "last_updated_time": lambda m: m["last_updated_time"] or "",
}


@routes.get("/api/v1/models", allow=USERS, query=ModelsQuery, response=ModelsResponse)
async def list_models(request: web.Request) -> web.Response:
    """Every model (any user reads them all), filtered and ordered."""
    await check_model_access(store_of(request), principal_of(request), "read")
    query = parse(ModelsQuery, dict(request.query))
    models = [describe_model(v) for v in await all_models(store_of(request))]
    if query.name:
        models = [m for m in models if query.name in m["name"]]
    if query.label:
        models = [m for m in models if query.label in m["labels"]]
    if query.archived != "all":
        models = [m for m in models if m["archived"] == (query.archived == "true")]
    if query.workspace_names:
        wanted = {w.strip() for w in query.workspace_names.split(",") if w.strip()}
        models = [m for m in models if m["workspace"] in wanted]
    models.sort(key=lambda m: (_SORT_KEYS[query.sort_by](m), m["id"]))
    if query.order_by == "desc":
        models.reverse()
    return web.json_response({"models": models})


@routes.post("/api/v1/models", allow=USERS, body=CreateModelBody, response=Model)
async def create_model(request: web.Request) -> web.Response:
    """Creates a model owned by the caller (400 for a name that breaks the rules or a field
    over its bound, 409 when a model of that name exists)."""
    principal = principal_of(request)
    await check_model_access(store_of(request), principal, "create")
    body = parse(CreateModelBody, await read_json(request))
    workspace = _check_workspace(body.workspace_name)

    async def work(tx: Transaction) -> int:
        await lock_registry(tx)
        taken = await model_named(tx, body.name)
        model_id = await next_model_id(tx)
        command = CreateModel(
            model_id=model_id,
            name=body.name,
            actor=principal.name,
            description=body.description,
            labels=tuple(body.labels),
            metadata=body.metadata,
            notes=body.notes,
            workspace=workspace,
        )
        await append_accepted(
            tx,
            model_stream(model_id),
            decide_create_model(taken, command),
            expected_version=0,
            actor=principal.name,
        )
        return model_id

    model_id = await in_transaction(store_of(request), work)
    log.info("model created", model_id=model_id, by=principal.name)
    return web.json_response(await _described(request, model_id))


@routes.get("/api/v1/models/{name}", allow=USERS, response=Model)
async def get_model(request: web.Request) -> web.Response:
    """One model, by name or number (404 when there is none)."""
    await check_model_access(store_of(request), principal_of(request), "read")
    view = await model_of_path(store_of(request), request.match_info["name"])
    return web.json_response(describe_model(view))


@routes.add("PATCH", "/api/v1/models/{name}", allow=USERS, body=PatchModelBody, response=Model)
async def patch_model(request: web.Request) -> web.Response:
    """Changes a model's name, description, labels (deduplicated), metadata or notes (its owner
    or an admin; 409 while archived or when the new name is taken)."""
    body = parse(PatchModelBody, await read_json(request))
    principal = principal_of(request)
    command = EditModel(
        actor=principal.name,
        name=body.name,
        description=body.description,
        labels=tuple(body.labels) if body.labels is not None else None,
        metadata=body.metadata,
        notes=body.notes,
    )
    store = store_of(request)
    ref = request.match_info["name"]

    async def work(tx: Transaction) -> int:
        await lock_registry(tx)
        view = await model_of_path(tx, ref)
        await check_model_access(tx, principal, "change", owner=view.owner)
        taken_by = await model_named(tx, body.name) if body.name is not None else None
        await append_accepted(
            tx,
            model_stream(view.model_id),
            decide_edit_model(view, command, taken_by=taken_by),
            expected_version=view.version,
            actor=principal.name,
        )
        return view.model_id

    model_id = await in_transaction(store, work)
    return web.json_response(await _described(request, model_id))


def _archive_handler(archived: bool) -> Any:
    verb = "archive" if archived else "unarchive"

    async def handler(request: web.Request) -> web.Response:
        parse(EmptyBody, await read_json(request))
        command = SetModelArchived(archived=archived, actor=principal_of(request).name)
        view, events = await _change(request, lambda v: decide_model_archived(v, command))
        if events:
            log.info(f"model {verb}d", model_id=view.model_id)
        return web.json_response(await _described(request, view.model_id))

    handler.__name__ = f"{verb}_model"
    handler.__doc__ = (
        f"Appends ModelArchived: {verb}s the model (its owner or an admin; an archived model "
        "takes no edits and no new versions)."
    )
    return handler


for _archived in (True, False):
    routes.post(
        f"/api/v1/models/{{name}}/{'archive' if _archived else 'unarchive'}",
        allow=USERS,
        body=EmptyBody,
        response=Model,
    )(_archive_handler(_archived))


@routes.add("DELETE", "/api/v1/models/{name}", allow=USERS, response=DeletedResponse)
async def delete_model(request: web.Request) -> web.Response:
    """Deletes a model and its versions (its owner or an admin); their checkpoints are no
    longer kept for it and the next GC pass applies their experiments' policies again."""
    command = DeleteModel(actor=principal_of(request).name)
    view, _ = await _change(request, lambda v: decide_delete_model(v, command))
    log.info("model deleted", model_id=view.model_id, versions=len(view.versions))
    return web.json_response({"model": view.name})


@routes.get("/api/v1/models/{name}/versions", allow=USERS, response=ModelVersionsResponse)
async def get_model_versions(request: web.Request) -> web.Response:
    """A model and its versions, oldest first."""
    await check_model_access(store_of(request), principal_of(request), "read")
    view = await model_of_path(store_of(request), request.match_info["name"])
    return web.json_response(
        {"model": describe_model(view), "model_versions": await _versions(request, view)}
    )


async def _checkpoint_state(tx: Transaction, uuid: str, experiment_id: int) -> str:
    """The checkpoint's state as the log says it now: DELETED once a ``CheckpointsDeleted`` of
    its experiment names it, its experiment's state while that is being deleted, else
    COMPLETED (read under the registry lock; see :mod:`events.domain.model_registry`)."""
    experiment = await load_experiment(tx, experiment_id, with_trials=False)
    if experiment.state in (DELETING, DELETED):
        return str(experiment.state)
    deletions, _ = await tx.read_stream_facts(
        experiment_stream(experiment_id), [CheckpointsDeleted.event_type]
    )
    for recorded in deletions:
        if uuid in recorded.decode_as(CheckpointsDeleted).uuids:
            return DELETED
    return "COMPLETED"


@routes.post(
    "/api/v1/models/{name}/versions",
    allow=USERS,
    body=RegisterVersionBody,
    response=ModelVersion,
)
async def register_version(request: web.Request) -> web.Response:
    """Registers a COMPLETED checkpoint the caller may read as the model's next version (the
    model's owner or an admin; 404 unknown checkpoint, 403 another user's, 409 one not
    COMPLETED or an archived model)."""
    principal = principal_of(request)
    body = parse(RegisterVersionBody, await read_json(request))
    ref = request.match_info["name"]

    async def work(tx: Transaction) -> tuple[int, int]:
        await lock_registry(tx)
        view = await model_of_path(tx, ref)
        await check_model_access(tx, principal, "change", owner=view.owner)
        row, _ = await readable_checkpoint(request, body.checkpoint_uuid)
        uuid, experiment_id = str(row["uuid"]), int(row["experiment_id"])
        command = RegisterVersion(
            checkpoint_uuid=uuid,
            experiment_id=experiment_id,
            trial_id=int(row["trial_id"]),
            checkpoint_state=await _checkpoint_state(tx, uuid, experiment_id),
            creator=principal.name,
            name=body.name,
            comment=body.comment,
            labels=tuple(body.labels),
            metadata=body.metadata,
            notes=body.notes,
        )
        await append_accepted(
            tx,
            model_stream(view.model_id),
            decide_register_version(view, command),
            expected_version=view.version,
            actor=principal.name,
        )
        return view.model_id, view.next_version

    model_id, number = await in_transaction(store_of(request), work)
    log.info("model version registered", model_id=model_id, version=number, by=principal.name)
    view = await load_model(store_of(request), model_id)
    return web.json_response(await _one_version(request, view, view.versions[number].version))


async def _one_version(request: web.Request, view: ModelView, number: int) -> dict[str, Any]:
    version = view.versions[number]
    row = await pr.read_row(store_of(request), tracker_read.checkpoint, version.checkpoint_uuid)
    return describe_version(view, version, row)


@routes.get("/api/v1/models/{name}/versions/{version}", allow=USERS, response=ModelVersion)
async def get_model_version(request: web.Request) -> web.Response:
    """One version of a model (``-1``: the latest)."""
    await check_model_access(store_of(request), principal_of(request), "read")
    view = await model_of_path(store_of(request), request.match_info["name"])
    version = version_of_path(view, request.match_info["version"])
    return web.json_response(await _one_version(request, view, version.version))


@routes.add(
    "PATCH",
    "/api/v1/models/{name}/versions/{version}",
    allow=USERS,
    body=PatchVersionBody,
    response=ModelVersion,
)
async def patch_model_version(request: web.Request) -> web.Response:
    """Changes a version's name, comment, labels, metadata or notes; never its checkpoint
    (400 when ``checkpoint_uuid`` names another; 409 while the model is archived)."""
    body = parse(PatchVersionBody, await read_json(request))
    ref = request.match_info["version"]
    command = EditVersion(
        version=version_number(ref),
        actor=principal_of(request).name,
        name=body.name,
        comment=body.comment,
        labels=tuple(body.labels) if body.labels is not None else None,
        metadata=body.metadata,
        notes=body.notes,
        checkpoint_uuid=body.checkpoint_uuid,
    )
    view, _ = await _change(request, lambda v: decide_edit_version(v, command), version_ref=ref)
    number = version_of_path(view, ref).version
    fresh = await load_model(store_of(request), view.model_id)
    return web.json_response(await _one_version(request, fresh, number))


@routes.add(
    "DELETE", "/api/v1/models/{name}/versions/{version}", allow=USERS, response=DeletedResponse
)
async def delete_model_version(request: web.Request) -> web.Response:
    """Deletes a version (the model's owner, the version's creator or an admin); its checkpoint
    is no longer kept for it and the next GC pass applies its experiment's policy again."""
    ref = request.match_info["version"]
    command = DeleteVersion(version=version_number(ref), actor=principal_of(request).name)
    view, _ = await _change(request, lambda v: decide_delete_version(v, command), version_ref=ref)
    number = version_of_path(view, ref).version
    log.info("model version deleted", model_id=view.model_id, version=number)
    return web.json_response({"model": view.name, "version": number})
