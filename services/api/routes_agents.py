"""Agents: registration (a fact on ``agent-<id>``) and heartbeats (table ``agent_heartbeats``)."""

from __future__ import annotations

import json
import re

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.envelope import new
from events.store import Transaction
from events.types import AgentRegistered
from events.types.agent import Slot
from services.api import tables
from services.api.errors import not_found, parse, read_json
from services.api.inbox import in_transaction
from services.api.routing import AGENTS, RouteTable, store_of
from services.api.views import agent_stream, load_agent

log = structlog.get_logger("api")
routes = RouteTable("agents")

_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$")


class RegisterBody(BaseModel):
    """What an agent offers: its slots, pool and host."""

    resource_pool: str = "default"
    slots: list[Slot]
    hostname: str = ""
    idempotency_key: str | None = None


class RegisterResponse(BaseModel):
    """Whether a new ``AgentRegistered`` was appended (``false``: already registered as such)."""

    agent_id: str
    changed: bool


class HeartbeatBody(BaseModel):
    """The allocations the agent is running right now."""

    running: list[str] = Field(default_factory=list)
    idempotency_key: str | None = None


class HeartbeatResponse(BaseModel):
    """``registered: false`` tells the agent it was declared lost and must register again."""

    registered: bool


def _agent_id(request: web.Request) -> str:
    agent_id = request.match_info["agent_id"]
    if not _AGENT_ID.match(agent_id):
        raise not_found(f"no agent {agent_id!r} (ids are letters, digits and _.:@-)")
    return agent_id


_UPSERT_BEAT = """
    INSERT INTO agent_heartbeats (agent_id, beat_at, running) VALUES ($1, now(), $2::jsonb)
    ON CONFLICT (agent_id) DO UPDATE SET beat_at = excluded.beat_at, running = excluded.running"""


@routes.post(
    "/api/v1/agents/{agent_id}/register",
    allow=AGENTS,
    body=RegisterBody,
    response=RegisterResponse,
)
async def register(request: web.Request) -> web.Response:
    """Appends AgentRegistered unless the agent is already registered with the same slots."""
    agent_id = _agent_id(request)
    body = parse(RegisterBody, await read_json(request))
    event = AgentRegistered(
        agent_id=agent_id,
        resource_pool=body.resource_pool,
        slots=body.slots,
        hostname=body.hostname,
    )

    async def decide(tx: Transaction) -> bool:
        view = await load_agent(tx, agent_id)
        changed = not (view.registered and view.registration == event)
        if changed:
            await tx.append(
                agent_stream(agent_id), [new(event, actor="agent")], expected_version=view.version
            )
        await tx.conn.execute(_UPSERT_BEAT, agent_id, "[]")
        return changed

    changed = await in_transaction(store_of(request), decide)
    if changed:
        log.info("agent registered", agent_id=agent_id, slots=len(body.slots))
    return web.json_response({"agent_id": agent_id, "changed": changed})


@routes.post(
    "/api/v1/agents/{agent_id}/heartbeat",
    allow=AGENTS,
    body=HeartbeatBody,
    response=HeartbeatResponse,
)
async def heartbeat(request: web.Request) -> web.Response:
    """Records that the agent is alive and what it runs (a table row, not an event)."""
    agent_id = _agent_id(request)
    body = parse(HeartbeatBody, await read_json(request))
    store = store_of(request)
    await tables.execute(store, _UPSERT_BEAT, agent_id, json.dumps(body.running))
    view = await load_agent(store, agent_id)
    return web.json_response({"registered": view.registered})
