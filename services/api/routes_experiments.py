"""Experiments: create (config + code), read, and the user actions pause/activate/cancel/kill."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from typing import Any

import structlog
from aiohttp import BodyPartReader, web
from pydantic import BaseModel, Field

from events import lifecycle
from events.config import ConfigError, parse_config
from events.envelope import new
from events.store import Transaction
from events.types import ExperimentStateChanged, ExperimentSubmitted
from services.api import tables
from services.api.auth import Principal, principal_of
from services.api.errors import ApiError, bad_request, conflict, forbidden, not_found, parse
from services.api.errors import read_json as read_json_body
from services.api.inbox import in_transaction
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import TERMINAL_STATES, experiment_stream, load_experiment

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


class CreateExperimentResponse(BaseModel):
    """The new experiment's id."""

    id: int
    code_ref: str | None = None


class ActionBody(BaseModel):
    """An optional reason recorded with a state change."""

    reason: str = ""


class ActionResponse(BaseModel):
    """The experiment's state after the action, and whether it changed."""

    id: int
    state: str
    changed: bool


def _id(request: web.Request) -> int:
    raw = request.match_info["experiment_id"]
    if not raw.isdigit():
        raise not_found(f"no experiment {raw!r}")
    return int(raw)


def _may_manage(principal: Principal, owner: str) -> None:
    if not (principal.is_admin or (principal.kind == "user" and principal.name == owner)):
        raise forbidden("only the experiment's owner or an admin may do this")


def _validate_config(raw: str | dict[str, Any]) -> dict[str, Any]:
    try:
        config = parse_config(raw)
    except ConfigError as exc:
        errors = exc.errors or [("<config>", "invalid config")]
        path, message = errors[0]
        raise ApiError(
            400,
            f"invalid config: {path}: {message}",
            path=path,
            details={"errors": [{"path": p, "message": m} for p, m in errors]},
        ) from None
    return config.model_dump(mode="json")


def _decode_code(code: str | bytes | None) -> bytes | None:
    if code is None or code == "":
        return None
    if isinstance(code, str):
        try:
            data = base64.b64decode(code, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("code: must be a base64-encoded tar.gz", path="code") from None
    else:
        data = code
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
                code = bytes(await part.read(decode=True))
            elif part.name in ("config", "activate"):
                fields[part.name] = await part.text()
    except (ValueError, AssertionError, LookupError) as exc:
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
)
async def create_experiment(request: web.Request) -> web.Response:
    """Validates a config, stores the code content-addressed and appends ExperimentSubmitted."""
    principal = principal_of(request)
    if request.content_type.startswith("multipart/"):
        body, raw_code = await _read_multipart(request)
        code = _decode_code(raw_code)
    else:
        body = parse(CreateExperimentBody, await read_json_body(request))
        code = _decode_code(body.code)
    config = _validate_config(body.config)
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
        event = ExperimentSubmitted(
            experiment_id=experiment_id,
            config=config,
            code_ref=code_ref,
            owner=principal.name,
            activate=body.activate,
        )
        await tx.append(
            experiment_stream(experiment_id), [new(event, actor=principal.name)], expected_version=0
        )
    log.info("experiment submitted", experiment_id=experiment_id, owner=principal.name)
    return web.json_response({"id": experiment_id, "code_ref": code_ref})


@routes.get("/api/v1/experiments/{experiment_id}", allow=USERS)
async def get_experiment(request: web.Request) -> web.Response:
    """The experiment folded from its stream: state, owner, config, requested trials."""
    view = await load_experiment(store_of(request), _id(request))
    return web.json_response(view.describe())


# action -> (target state, states it may be taken from); see reference/determined.md §5.1.
TRANSITIONS: dict[str, tuple[str, frozenset[str]]] = {
    "pause": ("PAUSED", frozenset({"ACTIVE"})),
    "activate": ("ACTIVE", frozenset({"PAUSED", "STOPPING_ERROR"})),
    "cancel": ("STOPPING_CANCELED", frozenset({"ACTIVE", "PAUSED"})),
    "kill": ("STOPPING_KILLED", frozenset({"ACTIVE", "PAUSED", "STOPPING_CANCELED"})),
}


def _action_handler(action: str) -> Any:
    target, sources = TRANSITIONS[action]

    async def handler(request: web.Request) -> web.Response:
        principal = principal_of(request)
        experiment_id = _id(request)
        body = parse(ActionBody, await read_json_body(request))

        async def decide(tx: Transaction) -> dict[str, Any]:
            view = await load_experiment(tx, experiment_id, with_trials=False)
            _may_manage(principal, view.owner)
            if view.state == target:
                return {"id": experiment_id, "state": view.state, "changed": False}
            if view.state in TERMINAL_STATES or view.state not in sources:
                raise conflict(f"cannot {action} an experiment in state {view.state}")
            try:
                lifecycle.check_experiment(view.state, target)
            except lifecycle.IllegalTransitionError as exc:
                raise conflict(f"cannot {action}: {exc}") from None
            event = ExperimentStateChanged(
                experiment_id=experiment_id, state=target, reason=body.reason, actor=principal.name
            )
            await tx.append(
                experiment_stream(experiment_id),
                [new(event, actor=principal.name)],
                expected_version=view.version,
            )
            return {"id": experiment_id, "state": target, "changed": True}

        result = await in_transaction(store_of(request), decide)
        if result["changed"]:
            log.info("experiment state changed", experiment_id=experiment_id, state=target)
        return web.json_response(result)

    handler.__name__ = f"{action}_experiment"
    handler.__doc__ = f"Moves the experiment to {target} (owner or admin; 409 when not allowed)."
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
    if principal.kind == "user" and not principal.is_admin:
        owns = await tables.fetchval(
            store,
            """SELECT 1 FROM events WHERE type = 'ExperimentSubmitted'
               AND payload->>'code_ref' = $1 AND payload->>'owner' = $2 LIMIT 1""",
            code_ref,
            principal.name,
        )
        if not owns:
            raise forbidden("only agents, admins and the experiment's owner may read its code")
    data = await tables.fetchval(store, "SELECT data FROM code_blobs WHERE code_ref = $1", code_ref)
    if data is None:
        raise not_found(f"no code {code_ref}")
    return web.Response(body=bytes(data), content_type="application/gzip")
