"""The rendezvous of a run placed on two agents, through the API gateway and a real log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from events.domain.names import trial_stream
from events.domain.types import SlotsAllocated
from events.log.store import EventStore
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def two_agent_run(store: EventStore, run_id: int = 1) -> str:
    """Trial 11's run placed on agents a (slots 0, 1) and b (slots 0, 1)."""
    allocation = f"11.{run_id}"
    await store.append(
        trial_stream(11),
        [
            SlotsAllocated(
                trial_id=11,
                allocation_id=allocation,
                placements={"b": ["0", "1"], "a": ["0", "1"]},
                run_id=run_id,
            )
        ],
    )
    return allocation


async def test_rendezvous_completes_once_both_agents_joined(api: Api, store: EventStore) -> None:
    """A waiter blocks until the second agent joins, then both learn the chief's endpoint (agent
    a's), their node ranks and the world size; a repeated join appends nothing."""
    await submit_experiment(store)
    await allocate(store, 11, request=True, slots=("0",))  # run 1: one agent, replaced below
    alloc = await two_agent_run(store, run_id=2)
    path = f"/api/v1/allocations/{alloc}/rendezvous"
    agent_a, agent_b = await api.agent_token("a"), await api.agent_token("b")
    first = await api.ok(
        "POST", path, token=agent_b, json={"agent_id": "b", "address": "10.0.0.2", "port": 2002}
    )
    assert (first["complete"], first["joined"], first["node_rank"]) == (False, ["b"], 1)
    waiter = asyncio.create_task(
        api.ok("GET", f"{path}?agent_id=b&timeout_seconds=30", token=agent_b)
    )
    await asyncio.sleep(0)  # the waiter is in flight before a joins (not a timing assumption)
    await api.ok(
        "POST", path, token=agent_a, json={"agent_id": "a", "address": "10.0.0.1", "port": 2001}
    )
    await api.ok(
        "POST", path, token=agent_a, json={"agent_id": "a", "address": "10.0.0.9", "port": 9}
    )
    answer = await asyncio.wait_for(waiter, 30)
    assert answer["complete"] and answer["current"]
    assert (answer["chief_address"], answer["chief_port"]) == ("10.0.0.1", 2001)
    assert (answer["node_rank"], answer["rank_offset"], answer["num_nodes"]) == (1, 2, 2)
    assert answer["world_size"] == 4
    trial_token = api.trial_token(11, 2)
    seen_by_rank = await api.ok("GET", f"{path}?agent_id=a", token=trial_token)
    assert (seen_by_rank["node_rank"], seen_by_rank["chief_port"]) == (0, 2001)
    joins = [e for e in await store.read_stream(trial_stream(11)) if e.type == "RendezvousJoined"]
    assert [(e.payload["agent_id"], e.payload["port"]) for e in joins] == [("b", 2002), ("a", 2001)]


async def test_rendezvous_refuses_strangers_old_runs_and_malformed_joins(
    api: Api, store: EventStore
) -> None:
    """An agent outside the gang gets 400, a join for a replaced run 409, a bad port or address
    400 naming the field, another trial's token 403; none appends anything."""
    await submit_experiment(store)
    old = await two_agent_run(store, run_id=1)
    await two_agent_run(store, run_id=2)
    head = await store.head()
    path = f"/api/v1/allocations/{old}/rendezvous"
    good = {"agent_id": "a", "address": "10.0.0.1", "port": 2001}
    agent_a = await api.agent_token("a")
    status, body = await api.call(
        "POST",
        "/api/v1/allocations/11.2/rendezvous",
        token=await api.agent_token("z"),
        json={**good, "agent_id": "z"},
    )
    assert status == 400 and body["error"]["path"] == "agent_id"
    status, _ = await api.call("POST", path, token=agent_a, json=good)
    assert status == 409
    for field, value in (("port", 0), ("port", 70000), ("address", "a b;rm -rf /")):
        status, body = await api.call(
            "POST",
            "/api/v1/allocations/11.2/rendezvous",
            token=agent_a,
            json={**good, field: value},
        )
        assert status == 400 and body["error"]["path"] == field, (field, value, body)
    status, _ = await api.call(
        "GET", "/api/v1/allocations/11.2/rendezvous", token=api.trial_token(21)
    )
    assert status == 403
    stale = await api.ok("GET", f"{path}?agent_id=a&timeout_seconds=30", token=agent_a)
    assert stale["current"] is False and stale["complete"] is False
    after = await store.read_all(head)
    assert {e.type for e in after} <= {"RequestRejected"}  # refusals are audited, nothing joined
