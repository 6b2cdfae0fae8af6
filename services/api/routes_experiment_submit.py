"""Submitting an experiment (its config, checked, and its code, stored content-addressed) and
reading an experiment's code back."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from pathlib import Path
from typing import Any

import structlog
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, Field

from events.domain.checkpoint_storage import StorageNotAllowedError, check_storage
from events.domain.config import ConfigError, ConfigTooLargeError, ConfigWarning, parse_config
from events.domain.config.cluster import CheckpointStoragePolicy
from events.domain.deciders.experiment import SubmitExperiment, decide_submit
from events.domain.names import experiment_stream
from events.log.store import Transaction
from services.api import tables
from services.api.auth import principal_of
from services.api.decided import append_decided
from services.api.errors import ApiError, bad_request, forbidden, not_found, parse
from services.api.errors import read_json as read_json_body
from services.api.host_access import check_host_requests
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
from services.api.teams import current_teams, project_for_experiment
from services.api.templates import with_template

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
    project_id: int | None = Field(
        None, ge=1, description="the project to create it in (over the config's workspace/project)"
    )


class CreateExperimentResponse(BaseModel):
    """The new experiment's id, and what its config sets that cairn accepts but ignores."""

    id: int
    code_ref: str | None = None
    warnings: list[ConfigWarning] = []


def _parse_config(
    raw: str | dict[str, Any], policy: CheckpointStoragePolicy, default_root: Path
) -> tuple[dict[str, Any], list[ConfigWarning]]:
    config = parse_config(raw)
    data = config.model_dump(mode="json")
    check_storage(data.get("checkpoint_storage"), policy, default_root=default_root)
    return data, list(config.warnings)


async def validate_config(
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


def code_ref_of(code: bytes | None) -> str | None:
    """The content address of uploaded code (``sha256:<hex>``), or ``None`` for none."""
    return f"sha256:{hashlib.sha256(code).hexdigest()}" if code is not None else None


async def store_code(tx: Transaction, code_ref: str | None, code: bytes | None) -> None:
    """Stores uploaded code under its content address in ``tx`` (once: a repeat is a no-op)."""
    if code is None:
        return
    await tx.conn.execute(
        "INSERT INTO code_blobs (code_ref, data, size) VALUES ($1, $2, $3) "
        "ON CONFLICT (code_ref) DO NOTHING",
        code_ref,
        code,
        len(code),
    )


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
            elif part.name in ("config", "activate", "template", "project_id"):
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
    config, warnings = await validate_config(request, raw_config)
    check_host_requests(request, config)
    code_ref = code_ref_of(code)
    store = store_of(request)
    project = project_for_experiment(await current_teams(store), principal, config, body.project_id)
    experiment_id = await store.next_experiment_id()
    async with store.transaction() as tx:
        await store_code(tx, code_ref, code)
        submitted = decide_submit(
            SubmitExperiment(
                experiment_id=experiment_id,
                config=config,
                code_ref=code_ref,
                owner=principal.name,
                activate=body.activate,
                warnings=tuple(warnings),
                project_id=project.project_id,
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
