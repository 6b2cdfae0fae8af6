"""Who may speak as an agent or as a trial, against the real gateway and PostgreSQL: the join token
only joins, each agent's credential opens only its own allocations, a revoked one nothing, and a
trial token only its own run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairn.local.servers import nats_auth_dir, nats_authority
from events.domain.commands import agent_subject
from events.domain.types import TrialExited
from events.log.bus_auth import subjects_of
from events.log.store import EventStore
from services.api import agent_credentials
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    """The gateway on a fresh database, logged in as admin."""
    async with running_api(store) as client:
        yield client


async def join(api: Api, agent_id: str) -> str:
    """Joins ``agent_id`` with the join token, as an agent's first start does."""
    answer = await api.ok("POST", f"/api/v1/agents/{agent_id}/join", token=api.join, json={})
    return str(answer["token"])


async def test_another_agents_allocation_spec_is_forbidden(api: Api, store: EventStore) -> None:
    """Agent B's own credential gets 403 for the spec of a run placed on agent A, and cannot
    report it started or exited (even naming A), ship its logs or report its trial's metrics;
    A's credential gets the spec with a token of that run."""
    await submit_experiment(store)
    alloc = await allocate(store, 11, agent="agent-a")
    agent_a, agent_b = await join(api, "agent-a"), await join(api, "agent-b")
    spec = f"/api/v1/allocations/{alloc}/spec"
    for path in (spec, f"{spec}?agent_id=agent-a"):
        status, body = await api.call("GET", path, token=agent_b)
        assert status == 403 and "agent-b" in body["error"]["message"], body
    for report, body in (
        ("started", {"agent_id": "agent-a", "incarnation": "x"}),
        ("exited", {"agent_id": "agent-a", "exit_code": 0}),
    ):
        status, _ = await api.call(
            "POST", f"/api/v1/allocations/{alloc}/{report}", token=agent_b, json=body
        )
        assert status == 403, report
    status, _ = await api.call(
        "POST",
        f"/api/v1/allocations/{alloc}/logs",
        token=agent_b,
        json={"idempotency_key": "l", "lines": [{"line": "x"}]},
    )
    assert status == 403
    item = {"kind": "progress", "idempotency_key": "p", "progress": 0.5}
    status, _ = await api.call(
        "POST", "/api/v1/trials/11/reports", token=agent_b, json={"items": [item]}
    )
    assert status == 403
    got = await api.ok("GET", spec, token=agent_a)
    assert got["token"] == api.trial_token(11, 1)
    assert [e.type for e in await store.read_stream("trial-11")] == ["SlotsAllocated"]


async def test_the_join_token_alone_opens_nothing_but_the_join(api: Api, store: EventStore) -> None:
    """The join token cannot fetch a spec, register, heartbeat, report or read, and cannot join
    again as an agent that already joined (nor under an id whose command subject collides)."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)  # on gpu01, which joined with the fixture
    for method, path, body in (
        ("GET", f"/api/v1/allocations/{alloc}/spec", None),
        ("POST", "/api/v1/agents/gpu01/register", {"slots": []}),
        ("POST", "/api/v1/agents/gpu01/heartbeat", {"running": []}),
        ("POST", f"/api/v1/allocations/{alloc}/started", {"agent_id": "gpu01"}),
        ("GET", "/api/v1/experiments", None),
    ):
        status, answer = await api.call(method, path, token=api.join, json=body)
        assert status == 403 and "join token" in answer["error"]["message"], (path, answer)
    status, answer = await api.call("POST", "/api/v1/agents/gpu01/join", token=api.join, json={})
    assert status == 403 and "already joined" in answer["error"]["message"], answer
    await join(api, "rack.1")
    status, answer = await api.call("POST", "/api/v1/agents/rack_1/join", token=api.join, json={})
    assert status == 403 and "command subject" in answer["error"]["message"], answer
    status, _ = await api.call("POST", "/api/v1/agents/x/join", token="join:wrong", json={})
    assert status == 401


async def test_a_revoked_agent_credential_is_refused(api: Api, store: EventStore) -> None:
    """Once an admin revokes agent A's credential, every call with it is a 401, the listing
    says who revoked it, and A cannot join again with the join token; another agent is
    unaffected."""
    agent_a, agent_b = await join(api, "agent-a"), await join(api, "agent-b")
    register = {"slots": [{"slot_id": "0", "device": "cpu"}], "incarnation": "i1"}
    await api.ok("POST", "/api/v1/agents/agent-a/register", token=agent_a, json=register)
    status, _ = await api.call("POST", "/api/v1/agents/agent-a/revoke", token=agent_b, json={})
    assert status == 403
    revoked = await api.ok("POST", "/api/v1/agents/agent-a/revoke", token=api.admin, json={})
    assert revoked["revoked_by"] == "admin" and revoked["incarnation"] == "i1"
    for path, body in (
        ("/api/v1/agents/agent-a/heartbeat", {"running": [], "incarnation": "i1"}),
        ("/api/v1/agents/agent-a/register", register),
    ):
        status, _ = await api.call("POST", path, token=agent_a, json=body)
        assert status == 401, path
    status, answer = await api.call("POST", "/api/v1/agents/agent-a/join", token=api.join, json={})
    assert status == 403 and "revoked" in answer["error"]["message"], answer
    await api.ok("POST", "/api/v1/agents/agent-b/heartbeat", token=agent_b, json={"running": []})
    listed = await api.ok("GET", "/api/v1/agent-credentials", token=api.admin)
    by_id = {c["agent_id"]: c for c in listed["credentials"]}
    assert by_id["agent-a"]["revoked_at"] is not None and by_id["agent-b"]["revoked_at"] is None
    assert "token" not in by_id["agent-a"]
    status, _ = await api.call("GET", "/api/v1/agent-credentials", token=agent_b)
    assert status == 403


async def test_a_report_of_another_incarnation_is_refused(api: Api, store: EventStore) -> None:
    """After the agent registered as incarnation i2 (it restarted), a heartbeat or a started
    report naming the earlier incarnation i1 is a 409: that process is not the agent's."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    slots = [{"slot_id": "0", "device": "cpu"}]
    for incarnation in ("i1", "i2"):
        await api.ok(
            "POST",
            "/api/v1/agents/gpu01/register",
            token=api.agent,
            json={"slots": slots, "incarnation": incarnation},
        )
    status, _ = await api.call(
        "POST",
        "/api/v1/agents/gpu01/heartbeat",
        token=api.agent,
        json={"running": [], "incarnation": "i1", "seq": 1},
    )
    assert status == 409
    status, _ = await api.call(
        "POST",
        f"/api/v1/allocations/{alloc}/started",
        token=api.agent,
        json={"agent_id": "gpu01", "incarnation": "i1"},
    )
    assert status == 409
    await api.ok(
        "POST",
        f"/api/v1/allocations/{alloc}/started",
        token=api.agent,
        json={"agent_id": "gpu01", "incarnation": "i2"},
    )


async def test_an_earlier_runs_trial_token_is_refused_after_a_restart(
    api: Api, store: EventStore
) -> None:
    """After run 1 failed and run 2 was allocated, run 1's token is refused (403,
    run_not_current) for a metric report, a checkpoint report, the run-2 spec and its logs,
    and nothing is appended; run 2's own token reports."""
    await submit_experiment(store)
    first = await allocate(store, 11, run_id=1)
    old = api.trial_token(11, 1)
    metric = {
        "kind": "metrics",
        "idempotency_key": "m",
        "group": "training",
        "steps_completed": 1,
        "metrics": {"loss": 1.0},
    }
    await api.ok("POST", "/api/v1/trials/11/reports", token=old, json={"items": [metric]})
    await store.append(
        "trial-11",
        [TrialExited(trial_id=11, run_id=1, allocation_id=first, outcome="failed", exit_code=1)],
    )
    second = await allocate(store, 11, run_id=2, request=False)
    before = [e.type for e in await store.read_stream("trial-11")]
    checkpoint = {
        "kind": "checkpoint",
        "idempotency_key": "c",
        "uuid": "5c0a7d3e-7b0f-4a55-9a3a-1b2c3d4e5f60",
        "steps_completed": 2,
    }
    for item in ({**metric, "idempotency_key": "m2", "steps_completed": 2}, checkpoint):
        status, body = await api.call(
            "POST", "/api/v1/trials/11/reports", token=old, json={"items": [item]}
        )
        assert status == 403 and body["error"]["reason"] == "run_not_current", body
    for method, path, body in (
        ("GET", f"/api/v1/allocations/{second}/spec", None),
        ("POST", f"/api/v1/allocations/{second}/logs", {"idempotency_key": "l", "lines": []}),
    ):
        status, _ = await api.call(method, path, token=old, json=body)
        assert status == 403, path
    assert [e.type for e in await store.read_stream("trial-11")] == before
    new = api.trial_token(11, 2)
    assert new != old
    status, body = await api.call(
        "POST",
        "/api/v1/trials/11/reports",
        token=new,
        json={"items": [{**metric, "idempotency_key": "m3", "steps_completed": 3}]},
    )
    assert status == 200, body
    status, _ = await api.call("GET", f"/api/v1/allocations/{first}/spec", token=new)
    assert status == 403


async def test_a_joining_agent_gets_a_nats_user_for_its_own_subject_only(
    store: EventStore, nats_server: object, tmp_path: Path
) -> None:
    """With the bus's authority, a join hands the agent a NATS user whose permissions name only
    its own command subject, durable and inbox; the credential row records that user."""
    from cairn.local.servers import ServerProcess

    assert isinstance(nats_server, ServerProcess)
    authority = nats_authority(nats_auth_dir(nats_server.data_dir))
    async with running_api(store) as api:
        issued = await agent_credentials.issue(store, "rack-7", authority)
    assert issued.nats_creds is not None
    allowed = subjects_of(issued.nats_creds)
    assert allowed["sub"] == ["_INBOX_agent.rack-7.>"]
    assert not [s for s in allowed["pub"] if s.startswith("cairn.")]
    assert any(s.endswith(f"agent-rack-7.{agent_subject('rack-7')}") for s in allowed["pub"])
    assert not [s for s in allowed["pub"] if "gpu01" in s]
    listed = {c.agent_id: c for c in await agent_credentials.list_all(api.store)}
    assert listed["rack-7"].nats_user.startswith("U")
