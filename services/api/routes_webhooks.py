"""Webhooks: list, create, change a URL, delete, send a test delivery, read a signing key.

Decided by :mod:`events.domain.deciders.webhooks` over stream ``webhooks``; delivered by the
tracker (:mod:`services.tracker.webhooks`), whose delivery record each listed webhook shows.

Who: creating, changing, deleting, testing a webhook and reading its signing key need
``EDIT_WEBHOOKS`` on its workspace, or an admin for a global one. The list holds the global
webhooks and those of the workspaces where the caller has ``VIEW_WEBHOOKS``; a webhook's URL
(a Slack URL is a secret) is shown whole only to callers who may edit it, others see its
origin. A webhook the caller may not see answers 404.

A URL must lie under the cluster config's ``webhooks.allowed_urls`` (400 otherwise); a URL
naming an address, or a host that resolves now, to an address deliveries may not reach (the
cluster's own services, internal networks not in ``webhooks.allowed_networks``) is refused with
400 as well. Deliveries check the address again at every connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import socket
import time
from typing import Any, cast, get_args

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates.teams import Teams
from events.domain.aggregates.webhooks import Webhook, Webhooks, apply_webhooks
from events.domain.authorization import Permission
from events.domain.deciders.webhooks import (
    ChangeWebhookUrl,
    CreateWebhook,
    DeleteWebhook,
    decide_webhook,
)
from events.domain.types.webhooks import (
    WEBHOOK_FACTS,
    WEBHOOKS_STREAM,
    Trigger,
    TriggerType,
    WebhookMode,
    WebhookType,
)
from events.domain.webhooks.payloads import ping_body
from events.domain.webhooks.urls import (
    Endpoints,
    UrlError,
    address_problem,
    parse_url,
    url_problem,
)
from events.log.store import EventStore, Transaction
from services.api.auth import Principal, principal_of
from services.api.decided import append_accepted
from services.api.errors import ApiError, bad_request, forbidden, not_found, parse, read_json
from services.api.inbox import in_transaction
from services.api.routing import USERS, RouteTable, cluster_of, store_of
from services.api.stream_folds import StreamFold
from services.api.teams import allows, current_teams, load_teams, workspace_by_ref
from services.api.views import Reader
from services.tracker import read as tracker_read
from services.webhooks import signing
from services.webhooks.addresses import cluster_endpoints, literal_problem
from services.webhooks.sending import Poster

log = structlog.get_logger("api")
routes = RouteTable("webhooks")

RESOLVE_TIMEOUT = 3.0
"""Seconds a creation waits for the URL's host to resolve (unresolved: checked at delivery)."""

_TRIGGERS: tuple[str, ...] = get_args(TriggerType)


def _enum(value: str, names: tuple[str, ...], prefix: str, path: str) -> str:
    """``value`` as cairn names it; Determined's spelling (``WEBHOOK_TYPE_SLACK``) is accepted."""
    key = value.strip().lower().removeprefix(prefix)
    if key not in names:
        raise bad_request(f"{path}: {value[:40]!r} is not one of {', '.join(names)}", path=path)
    return key


class TriggerBody(BaseModel):
    """One trigger of a new webhook."""

    model_config = {"extra": "forbid"}

    trigger_type: str = Field(max_length=80)
    condition: dict[str, str] = Field(default_factory=dict, max_length=4)


class WebhookBody(BaseModel):
    """A new webhook (``workspace``: its id or name; absent: global, admins only)."""

    model_config = {"extra": "forbid"}

    name: str = Field(max_length=320)
    url: str = Field(max_length=4096)
    webhook_type: str = Field("default", max_length=40)
    workspace: str | int | None = None
    mode: str = Field("workspace", max_length=40)
    triggers: list[TriggerBody] = Field(max_length=64)


class WebhookPatch(BaseModel):
    """A webhook's new URL (the only field that changes; anything else: delete and create)."""

    model_config = {"extra": "forbid"}

    url: str = Field(max_length=4096)


class DeliveryOut(BaseModel):
    """How a webhook's deliveries went."""

    delivered: int
    failed: int
    pending: int
    attempts: int
    last_status: int | None
    last_error: str
    last_attempt_at: str | None


class TriggerOut(BaseModel):
    """A trigger."""

    trigger_type: str
    condition: dict[str, str]


class WebhookOut(BaseModel):
    """A webhook, with its delivery record (``url``: its origin only unless the caller may
    edit it; ``signing_key``: only in the answer to its creation)."""

    id: int
    name: str
    url: str
    webhook_type: str
    workspace_id: int | None
    workspace: str | None
    mode: str
    triggers: list[TriggerOut]
    owner: str
    editable: bool
    created_at: str | None
    delivery: DeliveryOut
    signing_key: str | None = None


class WebhooksResponse(BaseModel):
    """The webhooks the caller may see, by id."""

    webhooks: list[WebhookOut]


class DeletedResponse(BaseModel):
    """What was deleted."""

    id: int
    deleted: bool


class TestResponse(BaseModel):
    """How a test delivery went."""

    id: int
    ok: bool
    status: int | None
    error: str
    delivery_id: str


class SigningKeyResponse(BaseModel):
    """A webhook's signing key (see ``docs/webhooks.md``)."""

    id: int
    signing_key: str


class EmptyBody(BaseModel):
    """No fields."""

    model_config = {"extra": "forbid"}


# --- the fold ------------------------------------------------------------------------------


WEBHOOK_FOLD: StreamFold[Webhooks] = StreamFold(
    WEBHOOKS_STREAM,
    WEBHOOK_FACTS,
    Webhooks,
    lambda state, recorded: apply_webhooks(state, recorded),
)
"""Stream ``webhooks`` as the gateway folds it."""


async def load_webhooks(reader: Reader) -> Webhooks:
    """Stream ``webhooks`` folded afresh; its version is the stream's head."""
    return await WEBHOOK_FOLD.load(reader)


async def current_webhooks(store: EventStore) -> Webhooks:
    """The webhooks as of now (read only; never mutate it)."""
    return await WEBHOOK_FOLD.current(store)


# --- access -------------------------------------------------------------------------------


def may_edit(teams: Teams, principal: Principal, workspace_id: int | None) -> bool:
    """Whether the caller may create, change, delete or test a webhook of ``workspace_id``
    (``None``: a global one, admins only)."""
    if workspace_id is None:
        return principal.kind == "user" and principal.is_admin
    return allows(teams, principal, Permission.EDIT_WEBHOOKS, workspace_id=workspace_id)


def may_view(teams: Teams, principal: Principal, hook: Webhook) -> bool:
    """Whether the caller sees ``hook`` (every user sees the global ones)."""
    if hook.workspace_id is None:
        return principal.kind == "user"
    return allows(teams, principal, Permission.VIEW_WEBHOOKS, workspace_id=hook.workspace_id)


def _scope(teams: Teams, workspace_id: int | None) -> str:
    if workspace_id is None:
        return "cluster-wide (a global webhook: admins only)"
    workspace = teams.workspaces.get(workspace_id)
    return f"in workspace {workspace.name if workspace else workspace_id!r}"


def _editable(teams: Teams, principal: Principal, hook: Webhook) -> Webhook:
    """``hook`` if the caller may edit it: 404 when they cannot even see it, else 403."""
    if not may_view(teams, principal, hook):
        raise not_found(f"no webhook {hook.webhook_id}")
    if not may_edit(teams, principal, hook.workspace_id):
        raise forbidden(
            f"{principal.name} lacks permission {Permission.EDIT_WEBHOOKS.value} "
            f"{_scope(teams, hook.workspace_id)}"
        )
    return hook


def _webhook_id(request: web.Request) -> int:
    raw = request.match_info["webhook_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise bad_request(f"webhook id must be a positive integer, got {raw[:40]!r}", path="id")
    return int(raw)


def _origin(url: str) -> str:
    try:
        target = parse_url(url)
    except UrlError:
        return "…"
    return f"{target.scheme}://{target.host}:{target.port}/…"


def describe(
    teams: Teams,
    principal: Principal,
    hook: Webhook,
    record: tracker_read.DeliveryRecord | None,
) -> dict[str, Any]:
    """A webhook as the API shows it to ``principal``."""
    editable = may_edit(teams, principal, hook.workspace_id)
    workspace = teams.workspaces.get(hook.workspace_id) if hook.workspace_id else None
    last_at = record["last_attempt_at"] if record else None
    return {
        "id": hook.webhook_id,
        "name": hook.name,
        "url": hook.url if editable else _origin(hook.url),
        "webhook_type": hook.webhook_type,
        "workspace_id": hook.workspace_id,
        "workspace": workspace.name if workspace else None,
        "mode": hook.mode,
        "triggers": [t.model_dump() for t in hook.triggers],
        "owner": hook.owner,
        "editable": editable,
        "created_at": hook.created_at.isoformat() if hook.created_at else None,
        "delivery": {
            "delivered": record["delivered"] if record else 0,
            "failed": record["failed"] if record else 0,
            "pending": record["pending"] if record else 0,
            "attempts": record["attempts"] if record else 0,
            "last_status": record["last_status"] if record else None,
            "last_error": record["last_error"] if record else "",
            "last_attempt_at": last_at.isoformat() if last_at else None,
        },
    }


async def _records(store: EventStore, ids: list[int]) -> dict[int, tracker_read.DeliveryRecord]:
    async with store.connection() as conn:
        return await tracker_read.delivery_records(conn, ids)


async def _secret(store: EventStore) -> bytes:
    async with store.connection() as conn:
        secret = await tracker_read.webhook_signing_secret(conn)
    if secret is None:
        raise ApiError(503, "webhooks are not ready: the tracker has not created its tables yet")
    return secret


# --- addresses ------------------------------------------------------------------------------


async def _endpoints(request: web.Request) -> Endpoints:
    """The cluster's own services as this gateway knows them: its own listening address and
    the database."""
    own: list[tuple[str, int]] = []
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        own.append((str(sockname[0]), int(sockname[1])))
    return await asyncio.to_thread(cluster_endpoints, db=store_of(request).dsn, api=own)


async def _check_addresses(request: web.Request, url: str) -> None:
    """400 when ``url`` names, or its host resolves now to, an address deliveries may not
    reach (a host that does not resolve now is checked at every delivery)."""
    try:
        target = parse_url(url)
    except UrlError:
        return  # the decider says what is wrong with it
    policy = cluster_of(request).webhooks
    networks = policy.networks()
    endpoints = await _endpoints(request)
    if problem := literal_problem(target, networks, endpoints):
        raise bad_request(f"url: deliveries may not reach it: {problem}", path="url")
    if target.literal is not None:
        return
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT
        )
    except (OSError, TimeoutError):
        return
    for info in infos:
        try:
            address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        except ValueError:
            continue
        problem = address_problem(
            address, target.port, allowed_networks=networks, endpoints=endpoints
        )
        if problem is not None:
            raise bad_request(
                f"url: deliveries may not reach it: {target.host} resolves to {problem}",
                path="url",
            )


# --- routes ---------------------------------------------------------------------------------


async def _decide(request: web.Request, act: Any) -> tuple[Teams, Webhooks, list[Any]]:
    """Folds the teams and webhooks in a transaction, lets ``act`` authorize and decide, and
    appends at the folded version (decided again after a concurrent append)."""
    principal = principal_of(request)

    async def work(tx: Transaction) -> tuple[Teams, Webhooks, list[Any]]:
        teams = await load_teams(tx)
        hooks = await load_webhooks(tx)
        events = await append_accepted(
            tx,
            WEBHOOKS_STREAM,
            act(teams, hooks, principal),
            expected_version=hooks.version,
            actor=principal.name,
        )
        return teams, hooks, events

    return await in_transaction(store_of(request), work)


async def _answer(request: web.Request, webhook_id: int, **extra: Any) -> web.Response:
    store = store_of(request)
    teams = await current_teams(store)
    hooks = await current_webhooks(store)
    hook = hooks.webhooks.get(webhook_id)
    if hook is None:
        raise not_found(f"no webhook {webhook_id}")
    records = await _records(store, [webhook_id])
    out = describe(teams, principal_of(request), hook, records.get(webhook_id))
    return web.json_response({**out, **extra})


@routes.get("/api/v1/webhooks", allow=USERS, response=WebhooksResponse)
async def list_webhooks(request: web.Request) -> web.Response:
    """The webhooks the caller may see (global ones and their workspaces'), by id, each with
    how its deliveries went."""
    principal = principal_of(request)
    store = store_of(request)
    teams = await current_teams(store)
    hooks = await current_webhooks(store)
    shown = [h for h in hooks.in_order() if may_view(teams, principal, h)]
    records = await _records(store, [h.webhook_id for h in shown])
    return web.json_response(
        {"webhooks": [describe(teams, principal, h, records.get(h.webhook_id)) for h in shown]}
    )


NOT_READY = {"503": "the tracker has not created the webhook tables yet"}


@routes.post(
    "/api/v1/webhooks", allow=USERS, body=WebhookBody, response=WebhookOut, more_errors=NOT_READY
)
async def create_webhook(request: web.Request) -> web.Response:
    """Creates a webhook (``EDIT_WEBHOOKS`` on its workspace; a global one: admins); the answer
    carries its signing key."""
    body = parse(WebhookBody, await read_json(request))
    webhook_type = cast(
        WebhookType,
        _enum(body.webhook_type, get_args(WebhookType), "webhook_type_", "webhook_type"),
    )
    mode = cast(WebhookMode, _enum(body.mode, get_args(WebhookMode), "webhook_mode_", "mode"))
    triggers = []
    for index, given in enumerate(body.triggers):
        kind = given.trigger_type.strip().upper().removeprefix("TRIGGER_TYPE_")
        if kind not in _TRIGGERS:
            path = f"triggers[{index}].trigger_type"
            raise bad_request(
                f"{path}: {given.trigger_type[:40]!r} is not one of {', '.join(_TRIGGERS)}",
                path=path,
            )
        triggers.append(
            Trigger(trigger_type=cast(TriggerType, kind), condition=dict(given.condition))
        )
    policy = cluster_of(request).webhooks
    teams_now = await current_teams(store_of(request))
    principal = principal_of(request)
    workspace_id = None
    if body.workspace is not None:
        ref = str(body.workspace)
        workspace_id = workspace_by_ref(teams_now, ref).workspace_id
        if not allows(teams_now, principal, Permission.VIEW_WORKSPACE, workspace_id=workspace_id):
            raise not_found(f"no workspace {ref[:100]!r}")  # one it cannot see is not shown
    if not may_edit(teams_now, principal, workspace_id):
        raise forbidden(
            f"{principal.name} lacks permission {Permission.EDIT_WEBHOOKS.value} "
            f"{_scope(teams_now, workspace_id)}"
        )
    if problem := url_problem(body.url, policy.allowed_urls):
        raise bad_request(problem, path="url")
    await _check_addresses(request, body.url)
    command = CreateWebhook(
        name=body.name,
        url=body.url,
        webhook_type=webhook_type,
        workspace_id=workspace_id,
        mode=mode,
        triggers=tuple(triggers),
        actor=principal.name,
        allowed_urls=tuple(policy.allowed_urls),
    )

    def act(teams: Teams, hooks: Webhooks, caller: Principal) -> Any:
        if not may_edit(teams, caller, workspace_id):
            raise forbidden(f"{caller.name} lacks permission {Permission.EDIT_WEBHOOKS.value}")
        return decide_webhook(hooks, teams, command)

    *_, events = await _decide(request, act)
    webhook_id = events[0].webhook_id
    key = signing.webhook_key(await _secret(store_of(request)), webhook_id)
    log.info("webhook created", webhook_id=webhook_id, workspace_id=workspace_id)
    return await _answer(request, webhook_id, signing_key=key)


def _change(webhook_id: int, make: Any) -> Any:
    def act(teams: Teams, hooks: Webhooks, principal: Principal) -> Any:
        hook = hooks.webhooks.get(webhook_id)
        if hook is None:
            raise not_found(f"no webhook {webhook_id}")
        _editable(teams, principal, hook)
        return decide_webhook(hooks, teams, make(hook))

    return act


@routes.add(
    "PATCH", "/api/v1/webhooks/{webhook_id}", allow=USERS, body=WebhookPatch, response=WebhookOut
)
async def change_webhook_url(request: web.Request) -> web.Response:
    """Points a webhook at another URL (its pending deliveries too)."""
    webhook_id = _webhook_id(request)
    body = parse(WebhookPatch, await read_json(request))
    store = store_of(request)
    hook = (await current_webhooks(store)).webhooks.get(webhook_id)
    if hook is None:
        raise not_found(f"no webhook {webhook_id}")
    _editable(await current_teams(store), principal_of(request), hook)
    allowed = tuple(cluster_of(request).webhooks.allowed_urls)
    if problem := url_problem(body.url, allowed):
        raise bad_request(problem, path="url")
    await _check_addresses(request, body.url)
    await _decide(
        request, _change(webhook_id, lambda h: ChangeWebhookUrl(h.webhook_id, body.url, allowed))
    )
    return await _answer(request, webhook_id)


@routes.add("DELETE", "/api/v1/webhooks/{webhook_id}", allow=USERS, response=DeletedResponse)
async def delete_webhook(request: web.Request) -> web.Response:
    """Deletes a webhook; its pending deliveries are canceled."""
    webhook_id = _webhook_id(request)
    _, _, events = await _decide(
        request, _change(webhook_id, lambda h: DeleteWebhook(h.webhook_id))
    )
    log.info("webhook deleted", webhook_id=webhook_id)
    return web.json_response({"id": webhook_id, "deleted": bool(events)})


async def _hook_for_editor(request: web.Request) -> Webhook:
    webhook_id = _webhook_id(request)
    store = store_of(request)
    hook = (await current_webhooks(store)).webhooks.get(webhook_id)
    if hook is None:
        raise not_found(f"no webhook {webhook_id}")
    return _editable(await current_teams(store), principal_of(request), hook)


@routes.post(
    "/api/v1/webhooks/{webhook_id}/test",
    allow=USERS,
    body=EmptyBody,
    response=TestResponse,
    more_errors=NOT_READY,
)
async def test_webhook(request: web.Request) -> web.Response:
    """Sends the webhook one signed test delivery now and reports how its receiver answered
    (one attempt; a status of 400 or more, or no answer, is an error)."""
    parse(EmptyBody, await read_json(request))
    hook = await _hook_for_editor(request)
    store = store_of(request)
    key = signing.webhook_key(await _secret(store), hook.webhook_id)
    delivery = f"test-{secrets.token_hex(8)}"
    now = int(time.time())
    text = _json_text(ping_body(hook.webhook_type, delivery, now))
    poster = Poster(cluster_of(request).webhooks, await _endpoints(request))
    try:
        attempt = await poster.post(hook.url, text, signing.headers(key, now, text, delivery))
    finally:
        await poster.close()
    log.info("webhook tested", webhook_id=hook.webhook_id, ok=attempt.ok, status=attempt.status)
    return web.json_response(
        {
            "id": hook.webhook_id,
            "ok": attempt.ok,
            "status": attempt.status,
            "error": attempt.error,
            "delivery_id": delivery,
        }
    )


@routes.get("/api/v1/webhooks/{webhook_id}/signing-key", allow=USERS, response=SigningKeyResponse)
async def webhook_signing_key(request: web.Request) -> web.Response:
    """The key a webhook's deliveries are signed with (for whoever may edit it)."""
    hook = await _hook_for_editor(request)
    key = signing.webhook_key(await _secret(store_of(request)), hook.webhook_id)
    return web.json_response({"id": hook.webhook_id, "signing_key": key})


def _json_text(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


__all__ = ["current_webhooks", "describe", "load_webhooks", "may_edit", "may_view", "routes"]
