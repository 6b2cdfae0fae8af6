"""The model registry: models (create, list, read, edit, archive, move, delete) and their
numbered versions, each pointing at a COMPLETED checkpoint (register, list, read, edit, delete).

Every model lives in a workspace, and every route decides with that workspace's roles
(:func:`services.api.access.check_model_access`): a model in a workspace the caller may not read
is left out of the list and refused (403) by the other routes, as experiments are. Every change
is decided by :mod:`events.domain.deciders.model` under the registry lock
(:mod:`events.domain.model_registry`), which orders registrations against checkpoint deletions
and a model's create or move into a workspace against that workspace's deletion: the teams a
create or move decides on are folded in its transaction after the lock, and a workspace's
deletion counts its models under the same lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates import ModelView
from events.domain.aggregates.teams import Teams, Workspace
from events.domain.authorization import DEFAULT_WORKSPACE_ID, Permission
from events.domain.deciders import Decision
from events.domain.deciders.model import (
    CreateModel,
    DeleteModel,
    DeleteVersion,
    EditModel,
    EditVersion,
    MoveModel,
    RegisterVersion,
    SetModelArchived,
    decide_create_model,
    decide_delete_model,
    decide_delete_version,
    decide_edit_model,
    decide_edit_version,
    decide_model_archived,
    decide_move_model,
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
from events.log.envelope import Event
from events.log.store import Transaction
from services.api import projections_read as pr
from services.api.access import check_model_access, model_visible, readable_checkpoint
from services.api.auth import principal_of
from services.api.decided import append_accepted
from services.api.errors import bad_request, forbidden, parse, read_json
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
from services.api.teams import authorize, current_teams, load_teams
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
    workspace_id: int
    workspace: str = Field(description="its workspace's name")
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
    workspace_ids: str | None = Field(
        None, max_length=10_000, description="comma-separated workspace ids"
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
        None, max_length=1000, description="its workspace, by name (neither: Uncategorized)"
    )
    workspace_id: int | None = Field(None, ge=1, le=2**31, description="or by id")


class MoveModelBody(BaseModel):
    """Where the model goes: a workspace by id (Determined's field) or by name, not both."""

    model_config = {"extra": "forbid"}

    destination_workspace_id: int | None = Field(None, ge=1, le=2**31)
    workspace_name: str | None = Field(None, max_length=1000)


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


def _workspace_of_body(
    teams: Teams, name: str | None, workspace_id: int | None, *, id_field: str
) -> Workspace:
    """The workspace a body names by ``workspace_name`` or by id (field ``id_field``); the
    default one for neither; 400 naming the field for an unknown one or for both."""
    if name is not None and workspace_id is not None:
        raise bad_request(
            f"workspace_name, {id_field}: name the workspace once, by name or by id",
            path="workspace_name",
        )
    if name is not None:
        found = teams.workspace_named(name)
        if found is None:
            raise bad_request(f"workspace_name: no workspace {name[:100]!r}", path="workspace_name")
        return found
    if workspace_id is not None:
        if workspace_id not in teams.workspaces:
            raise bad_request(f"{id_field}: no workspace {workspace_id}", path=id_field)
        return teams.workspaces[workspace_id]
    return teams.workspaces[DEFAULT_WORKSPACE_ID]


def _ids_of(text: str) -> set[int]:
    """The ids of a comma-separated ``workspace_ids`` query; 400 for a part not digits."""
    ids = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if not (part.isascii() and part.isdigit() and len(part) <= 18):
            raise bad_request(
                f"workspace_ids: {part[:40]!r} is not a workspace id", path="workspace_ids"
            )
        ids.add(int(part))
    return ids


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
        await check_model_access(
            tx,
            principal,
            "change",
            workspace_id=view.workspace_id,
            owner=view.owner,
            creator=creator,
        )
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
    store = store_of(request)
    return describe_model(await load_model(store, model_id), await current_teams(store))


async def _readable_model(request: web.Request) -> ModelView:
    """The model of the path, if the caller may read it (404 unknown, 403 in a workspace where
    the caller may not read models)."""
    store = store_of(request)
    view = await model_of_path(store, request.match_info["name"])
    await check_model_access(
        store, principal_of(request), "read", workspace_id=view.workspace_id, owner=view.owner
    )
    return view


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
    """The models the caller may read (those of the workspaces where a role lets them, and
    their own), filtered and ordered."""
    principal = principal_of(request)
    if principal.kind != "user":
        raise forbidden("only users use the model registry")
    query = parse(ModelsQuery, dict(request.query))
    store = store_of(request)
    teams = await current_teams(store)
    models = [
        describe_model(v, teams)
        for v in await all_models(store)
        if model_visible(teams, principal, workspace_id=v.workspace_id, owner=v.owner)
    ]
    if query.name:
        models = [m for m in models if query.name in m["name"]]
    if query.label:
        models = [m for m in models if query.label in m["labels"]]
    if query.archived != "all":
        models = [m for m in models if m["archived"] == (query.archived == "true")]
    if query.workspace_names:
        wanted = {w.strip() for w in query.workspace_names.split(",") if w.strip()}
        models = [m for m in models if m["workspace"] in wanted]
    if query.workspace_ids:
        ids = _ids_of(query.workspace_ids)
        models = [m for m in models if m["workspace_id"] in ids]
    models.sort(key=lambda m: (_SORT_KEYS[query.sort_by](m), m["id"]))
    if query.order_by == "desc":
        models.reverse()
    return web.json_response({"models": models})


@routes.post("/api/v1/models", allow=USERS, body=CreateModelBody, response=Model)
async def create_model(request: web.Request) -> web.Response:
    """Creates a model owned by the caller in a workspace (``workspace_name`` or
    ``workspace_id``; neither: Uncategorized) where the caller may create models (400 for an
    unknown workspace, a name that breaks the rules or a field over its bound; 403 without
    ``create_model_registry`` there; 409 when the workspace is archived or a model of that name
    exists)."""
    principal = principal_of(request)
    if principal.kind != "user":
        raise forbidden("only users use the model registry")
    body = parse(CreateModelBody, await read_json(request))

    async def work(tx: Transaction) -> int:
        await lock_registry(tx)
        teams = await load_teams(tx)
        workspace = _workspace_of_body(
            teams, body.workspace_name, body.workspace_id, id_field="workspace_id"
        )
        await check_model_access(tx, principal, "create", workspace_id=workspace.workspace_id)
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
            workspace_id=workspace.workspace_id,
            workspace_name=workspace.name,
            workspace_archived=workspace.archived,
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
    """One model, by name or number (404 when there is none, 403 when the caller may not read
    its workspace's models)."""
    view = await _readable_model(request)
    return web.json_response(describe_model(view, await current_teams(store_of(request))))


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
        await check_model_access(
            tx, principal, "change", workspace_id=view.workspace_id, owner=view.owner
        )
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


@routes.post("/api/v1/models/{name}/move", allow=USERS, body=MoveModelBody, response=Model)
async def move_model(request: web.Request) -> web.Response:
    """Moves a model, with its versions, to another workspace (``destination_workspace_id``
    or ``workspace_name``): the caller may delete it where it is and create models where it
    goes (400 for an unknown workspace, 403 without either right, 409 when the workspace it
    goes to is archived)."""
    principal = principal_of(request)
    body = parse(MoveModelBody, await read_json(request))
    if body.workspace_name is None and body.destination_workspace_id is None:
        raise bad_request(
            "destination_workspace_id: name the workspace the model goes to (or workspace_name)",
            path="destination_workspace_id",
        )
    ref = request.match_info["name"]

    async def work(tx: Transaction) -> tuple[ModelView, list[Event]]:
        await lock_registry(tx)
        view = await model_of_path(tx, ref)
        await check_model_access(
            tx, principal, "delete", workspace_id=view.workspace_id, owner=view.owner
        )
        teams = await load_teams(tx)
        target = _workspace_of_body(
            teams,
            body.workspace_name,
            body.destination_workspace_id,
            id_field="destination_workspace_id",
        )
        authorize(
            teams,
            principal,
            Permission.CREATE_MODEL_REGISTRY,
            workspace_id=target.workspace_id,
            what=f"moving model {view.name!r} into workspace {target.name!r}",
        )
        command = MoveModel(
            workspace_id=target.workspace_id,
            workspace_name=target.name,
            actor=principal.name,
            workspace_archived=target.archived,
        )
        events = await append_accepted(
            tx,
            model_stream(view.model_id),
            decide_move_model(view, command),
            expected_version=view.version,
            actor=principal.name,
        )
        return view, events

    view, events = await in_transaction(store_of(request), work)
    if events:
        log.info("model moved", model_id=view.model_id, by=principal.name)
    return web.json_response(await _described(request, view.model_id))


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
    view = await _readable_model(request)
    teams = await current_teams(store_of(request))
    return web.json_response(
        {"model": describe_model(view, teams), "model_versions": await _versions(request, view)}
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
        await check_model_access(
            tx, principal, "change", workspace_id=view.workspace_id, owner=view.owner
        )
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
    view = await _readable_model(request)
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
