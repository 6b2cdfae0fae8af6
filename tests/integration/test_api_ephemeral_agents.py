"""Ephemeral agents through the API gateway on real PostgreSQL: a registration reserved for one
allocation, and an agent's request to preempt its run when its resource manager (Slurm)
signals the job (``POST /allocations/{id}/signals/pending_preemption``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from events.domain.aggregates.agent import fold_agent
from events.domain.aggregates.cluster import fold_cluster
from events.domain.types import KillRequested
from events.log.store import EventStore
from tests.integration.test_api_support import (
    Api,
    allocate,
    running_api,
    submit_experiment,
    types_of,
)

SLOTS = {"resource_pool": "slurm", "hostname": "n1", "slots": [{"slot_id": "0", "device": "cpu"}]}


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def test_a_reserved_registration_is_recorded_and_folded_into_the_agent_view(
    api: Api, store: EventStore
) -> None:
    """``reserved_for`` lands in AgentRegistered and in the agent and cluster folds; the same
    body again appends nothing; a malformed one is a 400 naming the field."""
    path = "/api/v1/agents/gpu01/register"
    body = {**SLOTS, "incarnation": "i1", "reserved_for": "11.1"}
    assert (await api.ok("POST", path, token=api.agent, json=body))["changed"] is True
    assert (await api.ok("POST", path, token=api.agent, json=body))["changed"] is False
    events = await store.read_stream("agent-gpu01")
    assert [e.type for e in events] == ["AgentRegistered"]
    assert events[0].payload["reserved_for"] == "11.1"
    assert fold_agent("gpu01", events).reserved_for == "11.1"
    assert fold_cluster(await store.read_all(0)).agents["gpu01"].reserved_for == "11.1"
    for bad in ("", "x" * 201, "11.1 ; drop"):
        status, answer = await api.call(
            "POST", path, token=api.agent, json={**body, "reserved_for": bad}
        )
        assert status == 400 and answer["error"]["path"] == "reserved_for", (bad, answer)
    await api.ok("POST", path, token=api.agent, json={**SLOTS, "incarnation": "i2"})
    assert fold_agent("gpu01", await store.read_stream("agent-gpu01")).reserved_for is None


async def test_pending_preemption_is_appended_once_for_the_holding_agent_only(
    api: Api, store: EventStore
) -> None:
    """The agent holding the run gets PreemptionRequested appended once (repeats: nothing);
    another agent is a 403, an unknown allocation a 404, and neither appends anything."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    path = f"/api/v1/allocations/{alloc}/signals/pending_preemption"
    other = await api.agent_token("gpu02")
    status, _ = await api.call(
        "POST", path, token=other, json={"agent_id": "gpu02", "reason": "SIGTERM"}
    )
    assert status == 403
    status, _ = await api.call(
        "POST", path, token=api.agent, json={"agent_id": "gpu02", "reason": "SIGTERM"}
    )
    assert status == 403
    for unknown in ("/api/v1/allocations/11.9/", "/api/v1/allocations/404.1/"):
        status, _ = await api.call(
            "POST",
            unknown + "signals/pending_preemption",
            token=api.agent,
            json={"agent_id": "gpu01", "reason": "SIGTERM"},
        )
        assert status == 404, unknown
    status, answer = await api.call(
        "POST", path, token=api.agent, json={"agent_id": "gpu01", "reason": "x" * 201}
    )
    assert status == 400 and answer["error"]["path"] == "reason", answer
    assert "PreemptionRequested" not in await types_of(store, "trial-11")

    first = await api.ok(
        "POST", path, token=api.agent, json={"agent_id": "gpu01", "reason": "SIGTERM"}
    )
    assert first["appended"] == ["PreemptionRequested"]
    again = await api.ok(
        "POST", path, token=api.agent, json={"agent_id": "gpu01", "reason": "SIGUSR2"}
    )
    assert again["appended"] == []
    [event] = [e for e in await store.read_stream("trial-11") if e.type == "PreemptionRequested"]
    assert event.payload["reason"] == "the resource manager signalled the job: SIGTERM"
    assert event.payload["agent_ids"] == ["gpu01"]
    poll = f"/api/v1/allocations/{alloc}/signals/preemption?timeout_seconds=0"
    assert await api.ok("GET", poll, token=api.trial_token(11)) == {
        "preempt": True,
        "current": True,
    }


async def test_pending_preemption_after_a_kill_appends_nothing(api: Api, store: EventStore) -> None:
    """A run the scheduler is killing already is not preempted on top of it."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    await store.append("trial-11", [KillRequested(trial_id=11, allocation_id=alloc, reason="k")])
    answer = await api.ok(
        "POST",
        f"/api/v1/allocations/{alloc}/signals/pending_preemption",
        token=api.agent,
        json={"agent_id": "gpu01", "reason": "SIGTERM"},
    )
    assert answer["appended"] == []
    assert "PreemptionRequested" not in await types_of(store, "trial-11")
