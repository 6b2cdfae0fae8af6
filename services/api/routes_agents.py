"""Agents: joining (an agent's own credential from the join token), registration (a fact on
``agent-<id>``), heartbeats (table ``agent_heartbeats``), and for users the agent and slot listings
(projections) and admins' enable/disable and credential revocation.

An agent's credential speaks only for its own agent id: registering or heartbeating as another is
a 403, and a report naming an incarnation other than the one the agent last registered is a 409.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel

from events.domain.aggregates import AgentView
from events.domain.deciders import Decision
from events.domain.deciders.agent import (
    LeaveAgent,
    RegisterAgent,
    SetSlotsEnabled,
    decide_leaving,
    decide_register,
    decide_slots_enabled,
)
from events.log.envelope import Event
from events.log.store import Transaction
from services.api import agent_credentials, history, tables
from services.api import projections_read as pr
from services.api.auth import Principal, check_agent, principal_of
from services.api.decided import append_accepted
from services.api.errors import conflict, not_found, parse, read_json
from services.api.inbox import in_transaction
from services.api.routing import AGENTS, JOINERS, USERS, Access, RouteTable, state_of, store_of
from services.api.views import agent_stream, load_agent
from services.contracts.agent import (
    HeartbeatBody,
    HeartbeatResponse,
    JoinBody,
    JoinResponse,
    LeavingBody,
    RegisterBody,
    RegisterResponse,
)
from services.tracker import read as tracker_read

log = structlog.get_logger("api")
routes = RouteTable("agents")

_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$")


ADMINS: frozenset[Access] = frozenset({"admin"})


class AgentsResponse(BaseModel):
    """Every agent with its slots."""

    agents: list[pr.Agent]


class SlotsResponse(BaseModel):
    """Every slot of every agent."""

    slots: list[pr.Slot]


class DisableBody(BaseModel):
    """``drain``: let the runs there finish instead of preempting them."""

    drain: bool = False


class EnableBody(BaseModel):
    """No fields."""


class AgentEnabledResponse(BaseModel):
    """Whether the agent's slots are enabled now."""

    agent_id: str
    enabled: bool


class SlotEnabledResponse(BaseModel):
    """Whether the slot is enabled now."""

    agent_id: str
    slot_id: str
    enabled: bool


class AgentCredentialInfo(BaseModel):
    """An agent's credential as listed (never the token)."""

    agent_id: str
    subject: str
    nats_user: str
    incarnation: str
    issued_at: str
    revoked_at: str | None
    revoked_by: str | None


class AgentCredentialsResponse(BaseModel):
    """Every agent credential ever issued."""

    credentials: list[AgentCredentialInfo]


class RevokeBody(BaseModel):
    """No fields."""


def _agent_id(request: web.Request) -> str:
    agent_id = request.match_info["agent_id"]
    if not _AGENT_ID.match(agent_id):
        raise not_found(f"no agent {agent_id!r} (ids are letters, digits and _.:@-)")
    return agent_id


def _own_agent_id(request: web.Request) -> tuple[str, Principal]:
    """The path's agent id, which an agent's credential must be issued to (403 otherwise)."""
    agent_id = _agent_id(request)
    principal = principal_of(request)
    check_agent(principal, agent_id)
    return agent_id, principal


def check_incarnation(principal: Principal, incarnation: str) -> None:
    """A 409 when an agent reports as a process other than the one it last registered as."""
    if (
        principal.kind == "agent"
        and principal.incarnation
        and incarnation
        and incarnation != principal.incarnation
    ):
        raise conflict(
            f"agent {principal.name} is registered as incarnation {principal.incarnation}, "
            f"not {incarnation}: this process is not the agent's current one"
        )


async def _decide_on_agent(
    tx: Transaction,
    agent_id: str,
    decide: Callable[[AgentView], Decision],
    *,
    actor: str,
    causation_id: str | None = None,
) -> list[Event]:
    """Folds the agent in ``tx`` and appends what ``decide`` decides against the folded version.

    Raises:
        ApiError: the decider refused.
        ConcurrencyError: the stream moved on since it was folded (retryable: re-fold).
    """
    view = await load_agent(tx, agent_id)
    return await append_accepted(
        tx,
        agent_stream(agent_id),
        decide(view),
        expected_version=view.version,
        actor=actor,
        causation_id=causation_id,
    )


@routes.post(
    "/api/v1/agents/{agent_id}/join",
    allow=JOINERS,
    body=JoinBody,
    response=JoinResponse,
)
async def join(request: web.Request) -> web.Response:
    """Issues the agent its own credential, once per agent id, to the holder of the join
    token (403 for an id that already joined or was revoked)."""
    agent_id = _agent_id(request)
    parse(JoinBody, await read_json(request))
    state = state_of(request)
    issued = await agent_credentials.issue(state.store, agent_id, state.nats_authority)
    log.info("agent joined", agent_id=agent_id, nats=issued.nats_creds is not None)
    return web.json_response(
        {
            "agent_id": agent_id,
            "token": issued.token,
            "nats_creds": issued.nats_creds,
            "inbox_prefix": issued.inbox_prefix,
        }
    )


@routes.get("/api/v1/agent-credentials", allow=ADMINS, response=AgentCredentialsResponse)
async def list_credentials(request: web.Request) -> web.Response:
    """Every agent credential ever issued, live and revoked (admin)."""
    found = await agent_credentials.list_all(store_of(request))
    return web.json_response({"credentials": [c.to_json() for c in found]})


@routes.post(
    "/api/v1/agents/{agent_id}/revoke",
    allow=ADMINS,
    body=RevokeBody,
    response=AgentCredentialInfo,
)
async def revoke_credential(request: web.Request) -> web.Response:
    """Revokes the agent's credential (admin): every later call with it is a 401, so its
    heartbeats stop counting and the scheduler declares it lost after ``agent_timeout``; the
    agent id cannot join again."""
    agent_id = _agent_id(request)
    parse(RevokeBody, await read_json(request))
    actor = principal_of(request).name
    found = await agent_credentials.revoke(store_of(request), agent_id, by=actor)
    if found is None:
        raise not_found(f"agent {agent_id} holds no credential")
    log.warning("agent credential revoked", agent_id=agent_id, actor=actor)
    return web.json_response(found.to_json())


# Every beat proves the agent alive; its running list replaces the stored one unless it is an
# older numbered heartbeat of the same process arriving late.
_NEWER = "(excluded.seq = 0 OR excluded.incarnation <> h.incarnation OR excluded.seq > h.seq)"
_UPSERT_BEAT = f"""
    INSERT INTO agent_heartbeats AS h (agent_id, beat_at, running, incarnation, seq)
    VALUES ($1, now(), $2::jsonb, $3, $4)
    ON CONFLICT (agent_id) DO UPDATE SET
        beat_at = excluded.beat_at,
        running = CASE WHEN {_NEWER} THEN excluded.running ELSE h.running END,
        incarnation = CASE WHEN {_NEWER} THEN excluded.incarnation ELSE h.incarnation END,
        seq = CASE WHEN {_NEWER} THEN excluded.seq ELSE h.seq END"""


@routes.post(
    "/api/v1/agents/{agent_id}/register",
    allow=AGENTS,
    body=RegisterBody,
    response=RegisterResponse,
)
async def register(request: web.Request) -> web.Response:
    """Appends AgentRegistered unless this agent process is already registered with the same
    slots and reservation (a restarted agent comes with a new incarnation, so it always
    registers anew)."""
    agent_id, principal = _own_agent_id(request)
    body = parse(RegisterBody, await read_json(request))
    command = RegisterAgent(
        agent_id=agent_id,
        resource_pool=body.resource_pool,
        slots=tuple(body.slots),
        hostname=body.hostname,
        incarnation=body.incarnation,
        reserved_for=body.reserved_for,
    )

    async def work(tx: Transaction) -> bool:
        events = await _decide_on_agent(
            tx, agent_id, lambda view: decide_register(view, command), actor=f"agent:{agent_id}"
        )
        await tx.conn.execute(_UPSERT_BEAT, agent_id, "[]", body.incarnation, 0)
        return bool(events)

    changed = await in_transaction(store_of(request), work)
    if principal.kind == "agent":
        await agent_credentials.bind_incarnation(store_of(request), agent_id, body.incarnation)
    if changed:
        log.info(
            "agent registered",
            agent_id=agent_id,
            slots=len(body.slots),
            reserved_for=body.reserved_for,
        )
    return web.json_response({"agent_id": agent_id, "changed": changed})


@routes.post(
    "/api/v1/agents/{agent_id}/leaving",
    allow=AGENTS,
    body=LeavingBody,
    response=RegisterResponse,
)
async def leaving(request: web.Request) -> web.Response:
    """Appends AgentLeaving for the registered process ``incarnation`` (once; ``changed: false``
    when it already said so, or is not the registered process): the scheduler places nothing
    more on the agent until it registers anew (protocol.md)."""
    agent_id, principal = _own_agent_id(request)
    body = parse(LeavingBody, await read_json(request))
    check_incarnation(principal, body.incarnation)

    command = LeaveAgent(agent_id=agent_id, incarnation=body.incarnation)

    async def work(tx: Transaction) -> bool:
        events = await _decide_on_agent(
            tx,
            agent_id,
            lambda view: decide_leaving(view, command),
            actor=f"agent:{agent_id}",
            causation_id=body.idempotency_key,
        )
        return bool(events)

    changed = await in_transaction(store_of(request), work)
    if changed:
        log.info("agent leaving", agent_id=agent_id, incarnation=body.incarnation)
    return web.json_response({"agent_id": agent_id, "changed": changed})


@routes.post(
    "/api/v1/agents/{agent_id}/heartbeat",
    allow=AGENTS,
    audit=False,
    body=HeartbeatBody,
    response=HeartbeatResponse,
)
async def heartbeat(request: web.Request) -> web.Response:
    """Records that the agent is alive and what it runs (a table row, not an event)."""
    agent_id, principal = _own_agent_id(request)
    body = parse(HeartbeatBody, await read_json(request))
    check_incarnation(principal, body.incarnation)
    store = store_of(request)
    running = json.dumps(body.running)
    await tables.execute(store, _UPSERT_BEAT, agent_id, running, body.incarnation, body.seq)
    view = await load_agent(store, agent_id)
    return web.json_response({"registered": view.registered})


# --- users: listings and enable/disable -----------------------------------------------------


@routes.get("/api/v1/agents", allow=USERS, query=history.AtQuery, response=AgentsResponse)
async def list_agents(request: web.Request) -> web.Response:
    """Every agent from the projection, with its slots and last heartbeat (with ``at``: as
    folded from the log up to then, without heartbeats)."""
    store = store_of(request)
    at = await history.position_at(store, request)
    if at is not None:
        return web.json_response({"agents": await history.agents_at(store, at)})
    return web.json_response({"agents": await pr.list_agents(store)})


@routes.get("/api/v1/agents/{agent_id}", allow=USERS, query=history.AtQuery, response=pr.Agent)
async def get_agent(request: web.Request) -> web.Response:
    """One agent from the projection, with its slots and last heartbeat (with ``at``: as
    folded from the log up to then, without heartbeats)."""
    agent_id = _agent_id(request)
    store = store_of(request)
    at = await history.position_at(store, request)
    if at is not None:
        agents = await history.agents_at(store, at, agent_id)
    else:
        agents = await pr.list_agents(store, agent_id)
    if not agents:
        when = "" if at is None else f" at position {at}"
        raise not_found(f"no agent {agent_id}{when}")
    return web.json_response(agents[0])


@routes.get("/api/v1/slots", allow=USERS, response=SlotsResponse)
async def list_slots(request: web.Request) -> web.Response:
    """Every slot of every agent, from the projection."""
    return web.json_response(
        {"slots": await pr.read_rows(store_of(request), tracker_read.list_slots)}
    )


async def _toggle(request: web.Request, slot_id: str | None, enable: bool) -> dict[str, Any]:
    """Appends SlotsEnabled/SlotsDisabled for one slot (or, ``slot_id=None``, the whole agent)."""
    agent_id = _agent_id(request)
    actor = principal_of(request).name
    raw = await read_json(request)
    drain = False
    if enable:
        parse(EnableBody, raw)
    else:
        drain = parse(DisableBody, raw).drain
    slot_ids = [slot_id] if slot_id is not None else []
    command = SetSlotsEnabled(
        agent_id=agent_id, enable=enable, actor=actor, slot_id=slot_id, drain=drain
    )

    async def work(tx: Transaction) -> None:
        await _decide_on_agent(
            tx, agent_id, lambda view: decide_slots_enabled(view, command), actor=actor
        )

    await in_transaction(store_of(request), work)
    log.info(
        "slots enabled" if enable else "slots disabled",
        agent_id=agent_id,
        slot_ids=slot_ids,
        drain=drain,
        actor=actor,
    )
    result: dict[str, Any] = {"agent_id": agent_id, "enabled": enable}
    if slot_id is not None:
        result["slot_id"] = slot_id
    return result


@routes.post(
    "/api/v1/agents/{agent_id}/enable",
    allow=ADMINS,
    body=EnableBody,
    response=AgentEnabledResponse,
)
async def enable_agent(request: web.Request) -> web.Response:
    """Appends SlotsEnabled for every slot of the agent (admin)."""
    return web.json_response(await _toggle(request, None, True))


@routes.post(
    "/api/v1/agents/{agent_id}/disable",
    allow=ADMINS,
    body=DisableBody,
    response=AgentEnabledResponse,
)
async def disable_agent(request: web.Request) -> web.Response:
    """Appends SlotsDisabled for every slot of the agent; its runs are preempted and requeued
    unless ``drain`` (admin)."""
    return web.json_response(await _toggle(request, None, False))


def _slot_id(request: web.Request) -> str:
    slot_id = request.match_info["slot_id"]
    if "\x00" in slot_id or len(slot_id) > 200:
        raise not_found(f"no slot {slot_id!r}")
    return slot_id


@routes.post(
    "/api/v1/agents/{agent_id}/slots/{slot_id}/enable",
    allow=ADMINS,
    body=EnableBody,
    response=SlotEnabledResponse,
)
async def enable_slot(request: web.Request) -> web.Response:
    """Appends SlotsEnabled for one slot (admin)."""
    return web.json_response(await _toggle(request, _slot_id(request), True))


@routes.post(
    "/api/v1/agents/{agent_id}/slots/{slot_id}/disable",
    allow=ADMINS,
    body=DisableBody,
    response=SlotEnabledResponse,
)
async def disable_slot(request: web.Request) -> web.Response:
    """Appends SlotsDisabled for one slot; a run on it is preempted and requeued unless
    ``drain`` (admin)."""
    return web.json_response(await _toggle(request, _slot_id(request), False))
