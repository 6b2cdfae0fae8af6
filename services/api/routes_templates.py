"""Config templates: list, read, set (create or replace) and remove (see
:mod:`services.api.templates`)."""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.config import ConfigError
from events.domain.deciders import Decision
from events.domain.deciders.template import (
    RemoveTemplate,
    SetTemplate,
    decide_remove_template,
    decide_set_template,
)
from events.log.store import Transaction
from services.api.auth import Principal, principal_of
from services.api.decided import append_accepted
from services.api.errors import bad_request, forbidden, parse, read_json
from services.api.inbox import in_transaction
from services.api.parsing import yaml_off_loop
from services.api.routing import USERS, RouteTable, store_of
from services.api.templates import (
    TemplateView,
    check_name,
    check_partial_config,
    existing_template,
    list_templates,
    load_template,
    stream_of,
)

log = structlog.get_logger("api")
routes = RouteTable("templates")


class Template(BaseModel):
    """A config template."""

    name: str
    owner: str
    config: dict[str, Any]
    updated_at: str | None


class TemplatesResponse(BaseModel):
    """Every template, by name."""

    templates: list[Template]


class SetTemplateBody(BaseModel):
    """The template's partial config, as YAML text or a mapping."""

    model_config = {"extra": "forbid"}

    config: str | dict[str, Any] = Field(description="YAML text or an already-parsed mapping")


class SetTemplateResponse(BaseModel):
    """The template now stored, and whether it was created."""

    name: str
    owner: str
    created: bool


class RemoveTemplateResponse(BaseModel):
    """The template removed."""

    name: str


async def _config_of(body: SetTemplateBody) -> dict[str, Any]:
    """The template's config as a mapping (YAML text parsed off the event loop); 400 naming
    ``config`` when it is not one."""
    config: Any = body.config
    if isinstance(config, str):
        try:
            config = await yaml_off_loop(config, source="config")
        except ConfigError as exc:
            _, message = exc.errors[0]
            raise bad_request(f"config: {message}", path="config") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise bad_request("config: a template must be a mapping of config fields", path="config")
    check_partial_config(config)
    return config


async def _append(
    tx: Transaction, view: TemplateView, decision: Decision, principal: Principal
) -> None:
    """Appends the decider's events to the template's stream at the version ``view`` was read
    at, by ``principal`` (refused: its error)."""
    await append_accepted(
        tx, stream_of(view.name), decision, expected_version=view.version, actor=principal.name
    )


def _check_owner(principal: Principal, view: TemplateView) -> None:
    if not (principal.is_admin or (principal.kind == "user" and principal.name == view.owner)):
        raise forbidden(
            f"only {view.owner!r}, who created template {view.name!r}, or an admin may change it"
        )


@routes.get("/api/v1/templates", allow=USERS, response=TemplatesResponse)
async def get_templates(request: web.Request) -> web.Response:
    """Every config template, by name."""
    return web.json_response({"templates": await list_templates(store_of(request))})


@routes.get("/api/v1/templates/{name}", allow=USERS, response=Template)
async def get_template(request: web.Request) -> web.Response:
    """One config template (404 when there is none by that name)."""
    view = await existing_template(store_of(request), request.match_info["name"])
    return web.json_response(view.describe())


@routes.add(
    "PUT",
    "/api/v1/templates/{name}",
    allow=USERS,
    body=SetTemplateBody,
    response=SetTemplateResponse,
)
async def put_template(request: web.Request) -> web.Response:
    """Creates or replaces a config template (replacing one: its creator or an admin)."""
    principal = principal_of(request)
    name = check_name(request.match_info["name"])
    config = await _config_of(parse(SetTemplateBody, await read_json(request)))

    async def work(tx: Transaction) -> dict[str, Any]:
        view = await load_template(tx, name)
        if view.exists:
            _check_owner(principal, view)
        command = SetTemplate(name=name, config=config, actor=principal.name)
        await _append(tx, view, decide_set_template(view, command), principal)
        owner = view.owner if view.exists else principal.name
        return {"name": name, "owner": owner, "created": not view.exists}

    result = await in_transaction(store_of(request), work)
    log.info("template set", name=name, created=result["created"], by=principal.name)
    return web.json_response(result)


@routes.add("DELETE", "/api/v1/templates/{name}", allow=USERS, response=RemoveTemplateResponse)
async def delete_template(request: web.Request) -> web.Response:
    """Removes a config template (its creator or an admin; 404 when there is none)."""
    principal = principal_of(request)
    name = request.match_info["name"]

    async def work(tx: Transaction) -> dict[str, Any]:
        view = await existing_template(tx, name)
        _check_owner(principal, view)
        command = RemoveTemplate(name=name, actor=principal.name)
        await _append(tx, view, decide_remove_template(view, command), principal)
        return {"name": name}

    result = await in_transaction(store_of(request), work)
    log.info("template removed", name=name, by=principal.name)
    return web.json_response(result)
