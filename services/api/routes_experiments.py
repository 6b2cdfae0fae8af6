"""Experiments: create (config + code), list and read, the user actions pause/activate/cancel/kill,
archive/unarchive and delete, and an experiment's trials and checkpoints."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from pathlib import Path
from typing import Any, Literal

import structlog
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, Field, field_validator

from events.domain import lifecycle
from events.domain.checkpoint_storage import StorageNotAllowedError, check_storage
from events.domain.config import ConfigError, ConfigTooLargeError, ConfigWarning, parse_config
from events.domain.config.cluster import CheckpointStoragePolicy
from events.domain.deciders.experiment import (
    TRANSITIONS,
    Action,
    ChangeState,
    DeleteExperiment,
    SetArchived,
    SubmitExperiment,
    decide_archived,
    decide_delete,
    decide_state,
    decide_submit,
)
from events.domain.names import experiment_stream
from events.log.store import Transaction
from services.api import history, tables
from services.api import projections_read as pr
from services.api.access import readable_experiment
from services.api.auth import principal_of
from services.api.decided import accepted, append_decided
from services.api.errors import ApiError, bad_request, forbidden, not_found, parse
from services.api.errors import read_json as read_json_body
from services.api.host_access import check_host_requests
from services.api.inbox import in_transaction
from services.api.limits import (
    DEFAULT_MAX_BODY,
    EXPERIMENT_MAX_BODY,
    MAX_CODE_BYTES,
    read_part,
    too_large,
)
from services.api.parsing import off_loop
from services.api.routes_checkpoints import CHECKPOINT_ROOT
from services.api.routing import USERS, RouteTable, cluster_of, store_of
from services.api.templates import with_template
from services.api.views import (
    MAX_ID,
    ExperimentView,
    check_owner,
    load_experiment,
)

log = structlog.get_logger("api")
routes = RouteTable("experiments")

GZIP_MAGIC = b"\x1f\x8b"
CODE_REF = re.compile(r"^sha256:[0-9a-f]{64}$")


class CreateExperimentBody(BaseModel):
    """A new experiment: its config, its code and whether to start it now.

    As ``multipart/form-data`` the same fields are parts, and ``code`` is the raw tar.gz file.
    """

    config: str | dict[str, Any] = Field(description="YAML text or an already-parsed mapping")
    code: str | None = Field(None, description="the code directory as a base64 tar.gz")
    activate: bool = True
    template: str | None = Field(
        None, max_length=200, description="a config template merged under the config"
    )


class CreateExperimentResponse(BaseModel):
    """The new experiment's id, and what its config sets that cairn accepts but ignores."""

    id: int
    code_ref: str | None = None
    warnings: list[ConfigWarning] = []


class ActionBody(BaseModel):
    """An optional reason recorded with a state change."""

    reason: str = ""


class ActionResponse(BaseModel):
    """The experiment's state after the action, and whether it changed."""

    id: int
    state: str
    changed: bool


class ExperimentsQuery(pr.PageQuery):
    """Filters and order of the experiment list (non-admins only ever see their own)."""

    state: str | None = Field(None, description="comma-separated states, e.g. ACTIVE,PAUSED")
    owner: str | None = Field(None, max_length=200)
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


def _id(request: web.Request) -> int:
    raw = request.match_info["experiment_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_ID:
        raise not_found(f"no experiment {raw!r}")
    return int(raw)


async def _visible(request: web.Request, *, with_trials: bool = False) -> ExperimentView:
    """The experiment of the path, folded live; 404 unknown, 403 another user's."""
    return await readable_experiment(request, _id(request), with_trials=with_trials)


def _parse_config(
    raw: str | dict[str, Any], policy: CheckpointStoragePolicy, default_root: Path
) -> tuple[dict[str, Any], list[ConfigWarning]]:
    config = parse_config(raw)
    data = config.model_dump(mode="json")
    check_storage(data.get("checkpoint_storage"), policy, default_root=default_root)
    return data, list(config.warnings)


async def _validate_config(
    request: web.Request, raw: str | dict[str, Any]
) -> tuple[dict[str, Any], list[ConfigWarning]]:
    """The validated config as JSON and its warnings, parsed off the event loop
    (:func:`services.api.parsing.off_loop`); an invalid config is a 400 (413 when too large)
    naming its path, and so is a ``checkpoint_storage`` the cluster config does not allow."""
    policy = cluster_of(request).checkpoint_storage
    default_root = request.app[CHECKPOINT_ROOT]
    try:
        return await off_loop(_parse_config, raw, policy, default_root)
    except StorageNotAllowedError as exc:
        raise bad_request(f"invalid config: {exc}", path=exc.path) from None
    except ConfigError as exc:
        errors = exc.errors or [("<config>", "invalid config")]
        path, message = errors[0]
        too_large = isinstance(exc, ConfigTooLargeError)
        part = {"part": f"config.{path}"} if too_large and not path.startswith("<") else {}
        raise ApiError(
            413 if too_large else 400,
            f"invalid config: {path}: {message}",
            path=path,
            details={"errors": [{"path": p, "message": m} for p, m in errors]} | part,
        ) from None


def decode_code(request: web.Request, code: str | bytes | None) -> bytes | None:
    """The uploaded code (base64 text or raw bytes) checked to be a tar.gz within the size
    limit; ``None`` when none was given. Raises a 400 or 413 naming ``code``."""
    if code is None or code == "":
        return None
    if isinstance(code, str):
        if len(code) > MAX_CODE_BYTES * 4 // 3 + 4:
            raise too_large(request, MAX_CODE_BYTES, "code")
        try:
            data = base64.b64decode(code, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("code: must be a base64-encoded tar.gz", path="code") from None
    else:
        data = code
    if len(data) > MAX_CODE_BYTES:
        raise too_large(request, MAX_CODE_BYTES, "code")
    if not data.startswith(GZIP_MAGIC):
        raise bad_request("code: must be a gzip-compressed tar archive", path="code")
    return data


async def _read_multipart(request: web.Request) -> tuple[CreateExperimentBody, bytes | None]:
    fields: dict[str, Any] = {}
    code: bytes | None = None
    try:
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            if part.name == "code":
                code = await read_part(request, part, MAX_CODE_BYTES, "code")
            elif part.name in ("config", "activate", "template"):
                raw = await read_part(request, part, DEFAULT_MAX_BODY, part.name)
                fields[part.name] = raw.decode(part.get_charset(default="utf-8"))
    except (ValueError, AssertionError, LookupError, HttpProcessingError) as exc:
        raise bad_request(f"malformed multipart body: {exc}") from None
    if isinstance(fields.get("activate"), str):
        fields["activate"] = fields["activate"].strip().lower() not in ("false", "0", "no", "")
    return parse(CreateExperimentBody, fields), code


@routes.post(
    "/api/v1/experiments",
    allow=USERS,
    body=CreateExperimentBody,
    response=CreateExperimentResponse,
    multipart=True,
    max_body=EXPERIMENT_MAX_BODY,
)
async def create_experiment(request: web.Request) -> web.Response:
    """Validates a config, stores the code content-addressed and appends ExperimentSubmitted."""
    principal = principal_of(request)
    if request.content_type.startswith("multipart/"):
        body, raw_code = await _read_multipart(request)
        code = decode_code(request, raw_code)
    else:
        body = parse(CreateExperimentBody, await read_json_body(request))
        code = decode_code(request, body.code)
    raw_config = body.config
    if body.template is not None:
        raw_config = await with_template(store_of(request), body.template, raw_config)
    config, warnings = await _validate_config(request, raw_config)
    check_host_requests(request, config)
    code_ref = f"sha256:{hashlib.sha256(code).hexdigest()}" if code is not None else None
    store = store_of(request)
    experiment_id = await store.next_experiment_id()
    async with store.transaction() as tx:
        if code is not None:
            await tx.conn.execute(
                "INSERT INTO code_blobs (code_ref, data, size) VALUES ($1, $2, $3) "
                "ON CONFLICT (code_ref) DO NOTHING",
                code_ref,
                code,
                len(code),
            )
        submitted = decide_submit(
            SubmitExperiment(
                experiment_id=experiment_id,
                config=config,
                code_ref=code_ref,
                owner=principal.name,
                activate=body.activate,
                warnings=tuple(warnings),
            )
        )
        await append_decided(
            tx,
            experiment_stream(experiment_id),
            submitted,
            expected_version=0,
            actor=principal.name,
        )
    log.info(
        "experiment submitted",
        experiment_id=experiment_id,
        owner=principal.name,
        ignored=[w.path for w in warnings],
    )
    return web.json_response(
        {
            "id": experiment_id,
            "code_ref": code_ref,
            "warnings": [w.model_dump() for w in warnings],
        }
    )


@routes.get(
    "/api/v1/experiments", allow=USERS, query=ExperimentsQuery, response=ExperimentsResponse
)
async def list_experiments(request: web.Request) -> web.Response:
    """Experiments from the projection, filtered and paginated (users see their own only)."""
    principal = principal_of(request)
    query = parse(ExperimentsQuery, dict(request.query))
    owner = query.owner
    if not principal.is_admin:
        if owner is not None and owner != principal.name:
            raise forbidden("only admins may list other users' experiments")
        owner = principal.name
    rows, total = await pr.list_experiments(
        store_of(request),
        states=pr.states_of(query.state),
        owner=owner,
        archived=None if query.archived == "all" else query.archived == "true",
        name=query.name,
        descending=query.order_by == "-id",
        limit=query.limit,
        offset=query.offset,
    )
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
            history.experiment_detail(past, trials, at) | {"lineage": _lineage(past)}
        )
    body = view.describe()
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
    projected, _ = await pr.list_trials(store, view.experiment_id)
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


def _archive_handler(archived: bool) -> Any:
    verb = "archive" if archived else "unarchive"

    async def handler(request: web.Request) -> web.Response:
        principal = principal_of(request)
        experiment_id = _id(request)
        parse(EmptyBody, await read_json_body(request))

        async def work(tx: Transaction) -> dict[str, Any]:
            view = await load_experiment(tx, experiment_id, with_trials=False)
            check_owner(principal, view.owner)
            events = accepted(
                decide_archived(view, SetArchived(archived=archived, actor=principal.name))
            )
            await append_decided(
                tx,
                experiment_stream(experiment_id),
                events,
                expected_version=view.version,
                actor=principal.name,
            )
            return {"id": experiment_id, "archived": archived, "changed": bool(events)}

        result = await in_transaction(store_of(request), work)
        if result["changed"]:
            log.info(f"experiment {verb}d", experiment_id=experiment_id)
        return web.json_response(result)

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
    checkpoints and marks it DELETED (owner or admin; 409 otherwise)."""
    principal = principal_of(request)
    experiment_id = _id(request)

    async def work(tx: Transaction) -> dict[str, Any]:
        view = await load_experiment(tx, experiment_id, with_trials=False)
        check_owner(principal, view.owner)
        events = accepted(decide_delete(view, DeleteExperiment(actor=principal.name)))
        await append_decided(
            tx,
            experiment_stream(experiment_id),
            events,
            expected_version=view.version,
            actor=principal.name,
        )
        state = lifecycle.DELETING if events else view.state
        return {"id": experiment_id, "state": state, "changed": bool(events)}

    result = await in_transaction(store_of(request), work)
    if result["changed"]:
        log.info("experiment deleting", experiment_id=experiment_id, actor=principal.name)
    return web.json_response(result)


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
    rows, total = await pr.list_trials(
        store_of(request),
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
    rows, total = await pr.list_checkpoints(
        store_of(request),
        experiment_id=view.experiment_id,
        state=query.state,
        by_metric=query.sort_by == "metric",
        smaller_is_better=view.smaller_is_better,
        limit=query.limit,
        offset=query.offset,
    )
    return web.json_response({"checkpoints": rows, "pagination": pr.pagination(query, total)})


def _action_handler(action: Action) -> Any:
    target, _ = TRANSITIONS[action]

    async def handler(request: web.Request) -> web.Response:
        principal = principal_of(request)
        experiment_id = _id(request)
        body = parse(ActionBody, await read_json_body(request))
        command = ChangeState(action=action, actor=principal.name, reason=body.reason)

        async def work(tx: Transaction) -> dict[str, Any]:
            view = await load_experiment(tx, experiment_id, with_trials=False)
            check_owner(principal, view.owner)
            events = accepted(decide_state(view, command))
            await append_decided(
                tx,
                experiment_stream(experiment_id),
                events,
                expected_version=view.version,
                actor=principal.name,
            )
            return {"id": experiment_id, "state": target, "changed": bool(events)}

        result = await in_transaction(store_of(request), work)
        if result["changed"]:
            log.info("experiment state changed", experiment_id=experiment_id, state=target)
        return web.json_response(result)

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


@routes.get(
    "/api/v1/code/{code_ref}",
    allow=frozenset({"user", "agent"}),
    raw_response="application/gzip",
)
async def get_code(request: web.Request) -> web.Response:
    """An experiment's code tarball by content address (agents, admins, the owner)."""
    principal = principal_of(request)
    code_ref = request.match_info["code_ref"]
    if not CODE_REF.match(code_ref):
        raise not_found(f"no code {code_ref!r} (code refs look like sha256:<64 hex digits>)")
    store = store_of(request)
    if (
        principal.kind == "user"
        and not principal.is_admin
        and await store.submission_with_code(code_ref, owner=principal.name) is None
    ):
        raise forbidden("only agents, admins and the experiment's owner may read its code")
    data = await tables.fetchval(store, "SELECT data FROM code_blobs WHERE code_ref = $1", code_ref)
    if data is None:
        raise not_found(f"no code {code_ref}")
    return web.Response(body=bytes(data), content_type="application/gzip")
