"""The rendezvous of a run placed on several agents: agents join, then wait for the others.

``POST /allocations/{id}/rendezvous`` records ``RendezvousJoined`` once per (allocation, agent);
``GET /allocations/{id}/rendezvous`` long-polls until every agent of the gang has joined (or
the run is no longer current) and answers the chief's endpoint, the asker's node rank, the
number of nodes and the world size (see :mod:`services.api.rendezvous`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from aiohttp import web

from events.domain.aggregates.rendezvous import Rendezvous, fold_rendezvous
from events.domain.deciders.trial import JoinRendezvous, RendezvousState, decide_join
from events.domain.names import trial_stream
from events.log.store import Transaction
from services.api.access import MAX_POLL_SECONDS, POLL_EVERY, allocation_of_path
from services.api.auth import Principal, check_agent, check_holder, principal_of
from services.api.decided import append_accepted
from services.api.errors import parse, read_json
from services.api.inbox import claim, in_transaction, record
from services.api.routing import AGENTS, TRIAL_OR_AGENT, RouteTable, store_of
from services.api.views import Reader, allocation_of, load_trial, read_facts
from services.contracts.agent import RendezvousJoinBody, RendezvousQuery, RendezvousResponse

log = structlog.get_logger("api")
routes = RouteTable("rendezvous")


async def _load(
    reader: Reader, allocation_id: str, trial_id: int, principal: Principal | None = None
) -> tuple[Rendezvous, bool, int]:
    """The rendezvous, whether the run is current, and the trial stream's version (403 unless
    ``principal`` holds the allocation: see :func:`services.api.auth.check_holder`)."""
    trial = await load_trial(reader, trial_id)
    alloc = allocation_of(trial, allocation_id)
    if principal is not None:
        check_holder(principal, allocation_id, alloc.run_id, alloc.placements)
    joins, _ = await read_facts(reader, trial_stream(trial_id), ("RendezvousJoined",))
    view = fold_rendezvous(allocation_id, alloc.placements, joins)
    return view, trial.is_current(allocation_id), trial.version


@routes.post(
    "/api/v1/allocations/{allocation_id}/rendezvous",
    allow=AGENTS,
    body=RendezvousJoinBody,
    response=RendezvousResponse,
)
async def join(request: web.Request) -> web.Response:
    """Appends ``RendezvousJoined`` for the agent (once; a repeat answers the current state).

    400 if the agent holds no slots in the allocation, 409 if the run is no longer current.
    """
    allocation_id, trial_id = allocation_of_path(request)
    body = parse(RendezvousJoinBody, await read_json(request))
    check_agent(principal_of(request), body.agent_id)

    command = JoinRendezvous(
        trial_id=trial_id,
        allocation_id=allocation_id,
        agent_id=body.agent_id,
        address=body.address,
        port=body.port,
    )
    key = f"{allocation_id}:{body.agent_id}"

    async def work(tx: Transaction) -> dict[str, Any]:
        view, current, version = await _load(tx, allocation_id, trial_id)
        # a refusal rolls the claim back with the rest of the transaction
        fresh, _ = await claim(tx, "api.allocation.rendezvous", key)
        state = RendezvousState(
            placements=view.placements, members=view.members, current=current, repeat=not fresh
        )
        events = await append_accepted(
            tx,
            trial_stream(trial_id),
            decide_join(state, command),
            expected_version=version,
            actor=f"agent:{body.agent_id}",
            causation_id=body.idempotency_key,
        )
        if events:
            await record(tx, "api.allocation.rendezvous", key, {})
            view, current, _ = await _load(tx, allocation_id, trial_id)
            log.info("rendezvous joined", allocation_id=allocation_id, agent_id=body.agent_id)
        return {**view.answer(body.agent_id), "current": current}

    return web.json_response(await in_transaction(store_of(request), work))


@routes.get(
    "/api/v1/allocations/{allocation_id}/rendezvous",
    allow=TRIAL_OR_AGENT,
    query=RendezvousQuery,
    response=RendezvousResponse,
)
async def wait(request: web.Request) -> web.Response:
    """Long poll: answers once the rendezvous is complete or the run is no longer current,
    else the state so far after ``timeout_seconds``."""
    allocation_id, trial_id = allocation_of_path(request)
    query = parse(RendezvousQuery, dict(request.query))
    deadline = time.monotonic() + min(query.timeout_seconds, MAX_POLL_SECONDS)
    store = store_of(request)
    while True:
        view, current, _ = await _load(store, allocation_id, trial_id, principal_of(request))
        if view.complete or not current or time.monotonic() >= deadline:
            return web.json_response({**view.answer(query.agent_id), "current": current})
        await asyncio.sleep(min(POLL_EVERY, max(deadline - time.monotonic(), 0.0)))
