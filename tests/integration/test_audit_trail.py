"""The audit trail over a real gateway and PostgreSQL: every mutating route leaves an
attributable fact, refusals are recorded without secrets and bounded, and the trail is a
projection that rebuilds to the same rows."""

from __future__ import annotations

import asyncio
import base64
import gzip
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.domain.config.cluster import parse_cluster_config
from events.domain.types import CheckpointSaved
from events.log.store import EventStore
from services.api.app import all_routes
from services.api.audit_trail import PER_CALLER
from services.tracker import audit
from services.tracker import webhooks as tracker_webhooks
from services.tracker.service import catch_up
from tests.helpers import ADMIN_PASSWORD
from tests.integration.test_api_event_stream import read_events
from tests.integration.test_api_queries import end_trial, set_state, submit, user
from tests.integration.test_api_support import CONFIG, TEST_CLUSTER, Api, allocate, running_api

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
_ids = itertools.count(1)


HOOK = "http://127.0.0.2:9/hook"
"""A webhook URL the fixture's cluster config allows (nothing listens there: a test delivery
is answered with its failure)."""
HOOK_CLUSTER = TEST_CLUSTER.model_copy(
    update={
        "webhooks": parse_cluster_config(
            {"webhooks": {"allowed_urls": [HOOK], "allowed_networks": ["127.0.0.2/32"]}}
        ).webhooks
    }
)


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    await tracker_webhooks.migrate(store)
    async with running_api(store, tmp_path / "checkpoints", cluster=HOOK_CLUSTER) as client:
        yield client


async def send(
    api: Api, method: str, path: str, token: str | None, body: Any = None
) -> tuple[str, int, Any]:
    """Sends one request with a fresh X-Request-ID; returns the id, status and JSON."""
    request_id = f"t-{next(_ids)}"
    headers = {"X-Request-ID": request_id}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with api.session.request(method, api.url + path, json=body, headers=headers) as resp:
        assert resp.headers["X-Request-ID"] == request_id
        data = await resp.json() if resp.content_type == "application/json" else None
        return request_id, resp.status, data


async def trail(store: EventStore, where: str = "true", *args: Any) -> list[dict[str, Any]]:
    """Brings the audit projection to the head of the log and reads rows matching ``where``."""
    await catch_up(store)
    rows = await store.fetch(f"SELECT * FROM audit_trail WHERE {where} ORDER BY position", *args)
    return [dict(r) for r in rows]


async def test_every_mutating_route_is_found_in_the_trail(api: Api, store: EventStore) -> None:
    """Each mutating route of the router, driven once with its own request id, leaves a row in
    the trail with that id and the right actor (a new route without a driver fails here)."""
    admin, agent = api.admin, api.agent
    code = base64.b64encode(gzip.compress(b"fake tar")).decode()
    bob = await user(api, store, "bob")
    spare = await api.login("bob", "pw")
    listed = (await api.ok("GET", "/api/v1/tokens", token=spare))["tokens"]
    spare_id = next(t["id"] for t in listed if t["current"])
    await submit(store, 2)
    await set_state(store, 2, "STOPPING_COMPLETED", "COMPLETED")
    slots = {"resource_pool": "default", "hostname": "h1", "slots": [{"slot_id": "0"}]}
    item = {
        "kind": "metrics",
        "idempotency_key": "m1",
        "group": "training",
        "steps_completed": 5,
        "metrics": {"loss": 1.0},
        "run_id": 1,
    }

    # (method, route pattern, concrete path, token, body, expected status, actor in the trail)
    plan: list[tuple[str, str, str, str | None, Any, int, str]] = [
        (
            "POST",
            "/api/v1/users",
            "/api/v1/users",
            admin,
            {"username": "carol", "password": "s3cret-pw"},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/users/{username}/password",
            "/api/v1/users/carol/password",
            admin,
            {"password": "other-pw"},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/users/{username}/deactivate",
            "/api/v1/users/carol/deactivate",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/users/{username}/activate",
            "/api/v1/users/carol/activate",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "PUT",
            "/api/v1/users/{username}/agent-user-group",
            "/api/v1/users/carol/agent-user-group",
            admin,
            {"agent_uid": 1001, "agent_gid": 1001},
            200,
            "admin",
        ),
        # A login changes nothing but a session token (route audit=False): its refusal is what
        # the trail keeps.
        (
            "POST",
            "/api/v1/auth/login",
            "/api/v1/auth/login",
            None,
            {"username": "carol", "password": "wrong"},
            401,
            "anonymous",
        ),
        (
            "POST",
            "/api/v1/experiments",
            "/api/v1/experiments",
            admin,
            {"config": CONFIG, "code": code, "activate": False},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/unmanaged/trials",
            "/api/v1/unmanaged/trials",
            bob,
            {"external_experiment_id": "e", "external_trial_id": "t", "config": CONFIG},
            200,
            "bob",
        ),
        # An unmanaged run's heartbeat is telemetry (audit=False): a refused one is recorded.
        (
            "POST",
            "/api/v1/unmanaged/runs/heartbeat",
            "/api/v1/unmanaged/runs/heartbeat",
            admin,
            {},
            403,
            "admin",
        ),
        (
            "POST",
            "/api/v1/unmanaged/runs/close",
            "/api/v1/unmanaged/runs/close",
            bob,
            {},
            403,
            "bob",
        ),
        (
            "PATCH",
            "/api/v1/experiments/{experiment_id}",
            "/api/v1/experiments/1",
            admin,
            {"name": "renamed"},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/activate",
            "/api/v1/experiments/1/activate",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/pause",
            "/api/v1/experiments/1/pause",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/agents/{agent_id}/register",
            "/api/v1/agents/gpu01/register",
            agent,
            slots,
            200,
            "agent:gpu01",
        ),
        # Heartbeats are telemetry (audit=False): a refused one is recorded.
        (
            "POST",
            "/api/v1/agents/{agent_id}/heartbeat",
            "/api/v1/agents/gpu01/heartbeat",
            bob,
            {},
            403,
            "bob",
        ),
        (
            "POST",
            "/api/v1/agents/{agent_id}/disable",
            "/api/v1/agents/gpu01/disable",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/agents/{agent_id}/enable",
            "/api/v1/agents/gpu01/enable",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/agents/{agent_id}/slots/{slot_id}/disable",
            "/api/v1/agents/gpu01/slots/0/disable",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/agents/{agent_id}/slots/{slot_id}/enable",
            "/api/v1/agents/gpu01/slots/0/enable",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/allocations/{allocation_id}/started",
            "/api/v1/allocations/{alloc}/started",
            agent,
            {"agent_id": "gpu01"},
            200,
            "agent:gpu01",
        ),
        (
            "POST",
            "/api/v1/allocations/{allocation_id}/rendezvous",
            "/api/v1/allocations/{alloc}/rendezvous",
            agent,
            {"agent_id": "gpu01", "address": "127.0.0.1", "port": 29500},
            200,
            "agent:gpu01",
        ),
        (
            "POST",
            "/api/v1/allocations/{allocation_id}/signals/pending_preemption",
            "/api/v1/allocations/{alloc}/signals/pending_preemption",
            agent,
            {"agent_id": "gpu01", "reason": "SIGTERM"},
            200,
            "agent:gpu01",
        ),
        (
            "POST",
            "/api/v1/trials/{trial_id}/reports",
            "/api/v1/trials/11/reports",
            api.trial_token(11),
            {"items": [item]},
            200,
            "trial:11",
        ),
        # Log lines are telemetry (audit=False): a refused batch is recorded.
        (
            "POST",
            "/api/v1/allocations/{allocation_id}/logs",
            "/api/v1/allocations/{alloc}/logs",
            api.trial_token(11),
            {"lines": "not a list"},
            400,
            "trial:11",
        ),
        (
            "POST",
            "/api/v1/trials/{trial_id}/kill",
            "/api/v1/trials/11/kill",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/allocations/{allocation_id}/exited",
            "/api/v1/allocations/{alloc}/exited",
            agent,
            {"agent_id": "gpu01", "exit_code": 0},
            200,
            "agent:gpu01",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/cancel",
            "/api/v1/experiments/1/cancel",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/kill",
            "/api/v1/experiments/1/kill",
            bob,
            {},
            403,
            "bob",
        ),
        (
            "DELETE",
            "/api/v1/checkpoints",
            "/api/v1/checkpoints",
            admin,
            {"checkpoint_uuids": ["ck-2"]},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/continue",
            "/api/v1/experiments/2/continue",
            admin,
            {},
            409,
            "admin",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/archive",
            "/api/v1/experiments/2/archive",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/unarchive",
            "/api/v1/experiments/2/unarchive",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "DELETE",
            "/api/v1/experiments/{experiment_id}",
            "/api/v1/experiments/2",
            admin,
            None,
            200,
            "admin",
        ),
        (
            "PUT",
            "/api/v1/templates/{name}",
            "/api/v1/templates/gpu",
            bob,
            {"config": {"resources": {"slots_per_trial": 1}}},
            200,
            "bob",
        ),
        ("DELETE", "/api/v1/templates/{name}", "/api/v1/templates/gpu", bob, None, 200, "bob"),
        ("POST", "/api/v1/models", "/api/v1/models", bob, {"name": "audited"}, 200, "bob"),
        (
            "PATCH",
            "/api/v1/models/{name}",
            "/api/v1/models/audited",
            bob,
            {"description": "watched"},
            200,
            "bob",
        ),
        (
            "POST",
            "/api/v1/models/{name}/archive",
            "/api/v1/models/audited/archive",
            bob,
            {},
            200,
            "bob",
        ),
        (
            "POST",
            "/api/v1/models/{name}/unarchive",
            "/api/v1/models/audited/unarchive",
            bob,
            {},
            200,
            "bob",
        ),
        (
            "POST",
            "/api/v1/models/{name}/move",
            "/api/v1/models/audited/move",
            bob,
            {"workspace_name": "no-such-workspace"},
            400,
            "bob",
        ),
        (
            "POST",
            "/api/v1/models/{name}/versions",
            "/api/v1/models/audited/versions",
            bob,
            {"checkpoint_uuid": "no-such-checkpoint"},
            404,
            "bob",
        ),
        (
            "PATCH",
            "/api/v1/models/{name}/versions/{version}",
            "/api/v1/models/audited/versions/1",
            bob,
            {"comment": "none yet"},
            404,
            "bob",
        ),
        (
            "DELETE",
            "/api/v1/models/{name}/versions/{version}",
            "/api/v1/models/audited/versions/1",
            bob,
            None,
            404,
            "bob",
        ),
        ("DELETE", "/api/v1/models/{name}", "/api/v1/models/audited", bob, None, 200, "bob"),
        (
            "DELETE",
            "/api/v1/tokens/{token_id}",
            f"/api/v1/tokens/{spare_id}",
            admin,
            None,
            200,
            "admin",
        ),
        # Issuing a checkpoint uuid changes nothing (audit=False): a refused one is recorded.
        (
            "POST",
            "/api/v1/trials/{trial_id}/checkpoint-ids",
            "/api/v1/trials/11/checkpoint-ids",
            bob,
            {},
            403,
            "bob",
        ),
        ("POST", "/api/v1/commands", "/api/v1/commands", bob, {"argv": ["true"]}, 200, "bob"),
        ("POST", "/api/v1/notebooks", "/api/v1/notebooks", bob, {}, 200, "bob"),
        ("POST", "/api/v1/shells", "/api/v1/shells", bob, {}, 200, "bob"),
        (
            "POST",
            "/api/v1/tensorboards",
            "/api/v1/tensorboards",
            bob,
            {"experiment_ids": [987654]},
            404,
            "bob",
        ),
        (
            "POST",
            "/api/v1/allocations/{allocation_id}/ready",
            "/api/v1/allocations/{alloc}/ready",
            agent,
            {"agent_id": "gpu01", "address": "127.0.0.1", "port": 8888},
            404,
            "agent:gpu01",
        ),
        (
            "POST",
            "/api/v1/allocations/{allocation_id}/idle",
            "/api/v1/allocations/{alloc}/idle",
            agent,
            {"agent_id": "gpu01", "idle_seconds": 60},
            404,
            "agent:gpu01",
        ),
        (
            "POST",
            "/api/v1/tasks/{task_id}/kill",
            "/api/v1/tasks/0123456789abcdef/kill",
            bob,
            {},
            404,
            "bob",
        ),
        ("POST", "/api/v1/auth/logout", "/api/v1/auth/logout", bob, {}, 200, "bob"),
        (
            "POST",
            "/api/v1/agents/{agent_id}/leaving",
            "/api/v1/agents/gpu01/leaving",
            agent,
            {},
            200,
            "agent:gpu01",
        ),
        (
            "POST",
            "/api/v1/agents/{agent_id}/join",
            "/api/v1/agents/gpu09/join",
            api.join,
            {},
            200,
            "join",
        ),
        (
            "POST",
            "/api/v1/agents/{agent_id}/revoke",
            "/api/v1/agents/gpu09/revoke",
            admin,
            {},
            200,
            "admin",
        ),
        ("POST", "/api/v1/workspaces", "/api/v1/workspaces", admin, {"name": "lab"}, 200, "admin"),
        (
            "PATCH",
            "/api/v1/workspaces/{workspace}",
            "/api/v1/workspaces/lab",
            admin,
            {"name": "lab"},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/workspaces/{workspace}/projects",
            "/api/v1/workspaces/lab/projects",
            admin,
            {"name": "p"},
            200,
            "admin",
        ),
        (
            "PATCH",
            "/api/v1/projects/{project}",
            "/api/v1/projects/2",
            admin,
            {"description": "d"},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/projects/{project}/archive",
            "/api/v1/projects/2/archive",
            admin,
            None,
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/projects/{project}/unarchive",
            "/api/v1/projects/2/unarchive",
            admin,
            None,
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/experiments/{experiment_id}/move",
            "/api/v1/experiments/2/move",
            admin,
            {"destination_project_id": 2},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/roles/add-assignments",
            "/api/v1/roles/add-assignments",
            admin,
            {"role_name": "Viewer", "username": "bob", "workspace": "lab"},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/roles/remove-assignments",
            "/api/v1/roles/remove-assignments",
            admin,
            {"role_name": "Viewer", "username": "bob", "workspace": "lab"},
            200,
            "admin",
        ),
        ("POST", "/api/v1/groups", "/api/v1/groups", admin, {"name": "g"}, 200, "admin"),
        (
            "PATCH",
            "/api/v1/groups/{group}",
            "/api/v1/groups/g",
            admin,
            {"add_users": ["bob"]},
            200,
            "admin",
        ),
        ("DELETE", "/api/v1/groups/{group}", "/api/v1/groups/g", admin, None, 200, "admin"),
        (
            "POST",
            "/api/v1/resource-pools/{pool}/workspace-bindings",
            "/api/v1/resource-pools/gpu/workspace-bindings",
            admin,
            {"workspace_names": ["lab"]},
            200,
            "admin",
        ),
        (
            "PUT",
            "/api/v1/resource-pools/{pool}/workspace-bindings",
            "/api/v1/resource-pools/gpu/workspace-bindings",
            admin,
            {"workspace_names": ["lab"]},
            200,
            "admin",
        ),
        (
            "DELETE",
            "/api/v1/resource-pools/{pool}/workspace-bindings",
            "/api/v1/resource-pools/gpu/workspace-bindings",
            admin,
            {"workspace_names": ["lab"]},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/workspaces/{workspace}/archive",
            "/api/v1/workspaces/lab/archive",
            admin,
            None,
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/workspaces/{workspace}/unarchive",
            "/api/v1/workspaces/lab/unarchive",
            admin,
            None,
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/webhooks",
            "/api/v1/webhooks",
            admin,
            {
                "name": "ops",
                "url": HOOK,
                "triggers": [{"trigger_type": "CUSTOM"}],
                "mode": "specific",
            },
            200,
            "admin",
        ),
        (
            "PATCH",
            "/api/v1/webhooks/{webhook_id}",
            "/api/v1/webhooks/1",
            admin,
            {"url": HOOK + "/v2"},
            200,
            "admin",
        ),
        (
            "POST",
            "/api/v1/webhooks/{webhook_id}/test",
            "/api/v1/webhooks/1/test",
            admin,
            {},
            200,
            "admin",
        ),
        (
            "DELETE",
            "/api/v1/webhooks/{webhook_id}",
            "/api/v1/webhooks/1",
            admin,
            None,
            200,
            "admin",
        ),
        ("DELETE", "/api/v1/projects/{project}", "/api/v1/projects/2", admin, None, 200, "admin"),
        (
            "DELETE",
            "/api/v1/workspaces/{workspace}",
            "/api/v1/workspaces/lab",
            admin,
            None,
            200,
            "admin",
        ),
    ]
    routes = {(r.method, r.path) for r in all_routes() if r.method in MUTATING}
    planned = {(method, pattern) for method, pattern, *_ in plan}
    assert routes - planned == set(), "a mutating route has no driver in this test"
    assert planned - routes == set()

    alloc = ""
    sent: list[tuple[str, str, str, str]] = []
    for method, pattern, path, token, body, expected, actor in plan:
        if pattern == "/api/v1/allocations/{allocation_id}/started":
            alloc = await allocate(store, 11, experiment_id=1)
        if pattern == "/api/v1/checkpoints":
            await allocate(store, 21, experiment_id=2)
            await store.append(
                "trial-21",
                [CheckpointSaved(trial_id=21, run_id=1, uuid="ck-2", steps_completed=5)],
            )
            await end_trial(store, 21)
            await catch_up(store)
        request_id, status, answer = await send(api, method, path.format(alloc=alloc), token, body)
        assert status == expected, (method, path, status, answer)
        sent.append((request_id, method, pattern, actor))

    rows = await trail(store, "request_id IS NOT NULL")
    by_request: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_request.setdefault(row["request_id"], []).append(row)
    for request_id, method, pattern, actor in sent:
        found = by_request.get(request_id)
        assert found, f"{method} {pattern} left nothing in the audit trail"
        assert {r["actor"] for r in found} == {actor}, (method, pattern, found)
        assert all(r["remote"] == "127.0.0.1" for r in found)


async def test_events_carry_actor_request_and_address(api: Api, store: EventStore) -> None:
    """An experiment created through the API is stored with the caller, the request id and the
    caller's address in its metadata, without the call site passing them; the event stream
    shows the address to admins only."""
    bob = await user(api, store, "bob")
    code = base64.b64encode(gzip.compress(b"fake tar")).decode()
    request_id, status, body = await send(
        api, "POST", "/api/v1/experiments", bob, {"config": CONFIG, "code": code}
    )
    assert status == 200, body
    [submitted] = await store.read_stream(f"experiment-{body['id']}")
    meta = submitted.metadata
    assert (meta.actor, meta.request_id, meta.remote) == ("bob", request_id, "127.0.0.1")
    query = f"?experiment_id={body['id']}"
    [own] = await read_events(api, bob, 1, query=query)
    [seen] = await read_events(api, api.admin, 1, query=query)
    assert own["data"]["metadata"]["request_id"] == request_id
    assert own["data"]["metadata"]["remote"] is None
    assert seen["data"]["metadata"]["remote"] == "127.0.0.1"


async def test_refusals_are_recorded_without_secrets(api: Api, store: EventStore) -> None:
    """A 403, a bad config and a failed login each become RequestRejected with route, status
    and message, and neither the password, the token nor the body appears in the log."""
    bob = await user(api, store, "bob")
    await submit(store, 1)
    forbidden_id, status, _ = await send(api, "POST", "/api/v1/experiments/1/kill", bob, {})
    assert status == 403
    bad = CONFIG.replace("max_length: {batches: 100}", "max_length: {batches: hunter2-secret}")
    config_id, status, _ = await send(api, "POST", "/api/v1/experiments", bob, {"config": bad})
    assert status == 400
    login_id, status, _ = await send(
        api, "POST", "/api/v1/auth/login", None, {"username": "bob", "password": "hunter2-pw"}
    )
    assert status == 401

    rows = await trail(store, "type = 'RequestRejected'")
    by_request = {r["request_id"]: r for r in rows}
    refused = by_request[forbidden_id]
    assert refused["actor"] == "bob" and refused["experiment_id"] == 1
    detail = refused["detail"]
    assert detail["route"] == "/api/v1/experiments/{experiment_id}/kill"
    assert (detail["status"], detail["message"]) == (
        403,
        "bob lacks permission update_experiment in workspace 'Uncategorized' "
        "(experiment 1 is admin's)",
    )
    assert by_request[config_id]["actor"] == "bob"
    assert by_request[config_id]["detail"]["message"] == (
        "invalid input at searcher.max_length.batches"
    )
    assert by_request[login_id]["actor"] == "anonymous"
    dump = await store.fetchval(
        "SELECT string_agg(payload::text || metadata::text, ' ') FROM events"
    )
    for secret in ("hunter2", bob):
        assert secret not in dump


async def test_floods_are_bounded(api: Api, store: EventStore) -> None:
    """Many refusals by one caller record at most PER_CALLER facts in a window (the rest are
    counted); a trial re-sending the same report records nothing new, while a user's no-op
    change is recorded once per request."""
    bob = await user(api, store, "bob")
    await submit(store, 1)
    await allocate(store, 11)
    for _ in range(PER_CALLER * 3):
        _, status, _ = await send(api, "POST", "/api/v1/experiments/1/pause", bob, {})
        assert status == 403
    rows = await trail(store, "type = 'RequestRejected' AND actor = 'bob'")
    assert len(rows) == PER_CALLER
    report = {
        "items": [
            {
                "kind": "metrics",
                "idempotency_key": "m1",
                "group": "training",
                "steps_completed": 5,
                "metrics": {"loss": 1.0},
                "run_id": 1,
            }
        ]
    }
    before = await store.head()
    for _ in range(5):
        _, status, _ = await send(
            api, "POST", "/api/v1/trials/11/reports", api.trial_token(11), report
        )
        assert status == 200
    reported = [(e.type, e.metadata.actor) for e in await store.read_all(before)]
    assert reported == [("WorkloadCompleted", "trial:11")], reported
    for _ in range(2):
        _, status, _ = await send(
            api, "PATCH", "/api/v1/experiments/1", api.admin, {"name": "same"}
        )
        assert status == 200
    assert [e.type for e in await store.read_all(before + 1)] == [
        "ExperimentRenamed",
        "RequestAccepted",
    ]


async def test_audit_api_filters_pages_and_is_for_admins(api: Api, store: EventStore) -> None:
    """GET /api/v1/audit filters by actor, experiment, type and time, pages newest first by
    position, and answers 403 to a non-admin (which is itself recorded)."""
    bob = await user(api, store, "bob")
    await submit(store, 1, owner="bob")
    await submit(store, 2)
    for i, n in enumerate((1, 1, 2)):
        _, status, _ = await send(
            api, "PATCH", f"/api/v1/experiments/{n}", api.admin, {"description": f"d{i}"}
        )
        assert status == 200
    _, status, _ = await send(api, "GET", "/api/v1/audit", bob)
    assert status == 403
    await catch_up(store)

    def get(query: str) -> Any:
        return api.ok("GET", f"/api/v1/audit?{query}", api.admin)

    mine = (await get("actor=admin&experiment_id=1"))["entries"]
    assert [e["type"] for e in mine] == ["ExperimentDescribed", "ExperimentDescribed"]
    assert mine[0]["position"] > mine[1]["position"]
    assert all(e["actor"] == "admin" and e["remote"] == "127.0.0.1" for e in mine)
    refused = (await get("type=RequestRejected"))["entries"]
    assert refused[0]["actor"] == "bob" and refused[0]["detail"]["route"] == "/api/v1/audit"
    first = await get("limit=2")
    second = await get(f"limit=2&before={first['next_before']}")
    everything = (await get("limit=1000"))["entries"]
    assert [e["position"] for e in first["entries"] + second["entries"]] == [
        e["position"] for e in everything[:4]
    ]
    newest = everything[0]["recorded_at"]
    since = (await get(f"since={newest.replace('+', '%2B')}"))["entries"]
    assert since and all(e["recorded_at"] >= newest for e in since)
    assert (await get("until=2000-01-01T00:00:00Z"))["entries"] == []
    status, body = await api.call("GET", "/api/v1/audit?since=yesterday", api.admin)
    assert status == 400 and body["error"]["path"] == "since"


async def test_rebuild_gives_the_live_rows(api: Api, store: EventStore) -> None:
    """Truncating the trail and replaying the log from position 0, in pages of any size (the
    live consumer's too), gives the same rows."""
    bob = await user(api, store, "bob")
    await submit(store, 1)
    await allocate(store, 11)
    await send(api, "PATCH", "/api/v1/experiments/1", api.admin, {"name": "x"})
    await send(api, "POST", "/api/v1/experiments/1/kill", bob, {})
    await send(api, "POST", "/api/v1/trials/11/kill", api.admin, {})
    live = await trail(store)
    assert len(live) == await store.head()
    assert {r["experiment_id"] for r in live if r["stream_id"] == "trial-11"} == {1}
    for page in (5000, 3, 1):  # whole log, pages, one event at a time: the same rows
        applied = await audit.rebuild(store, batch=page)
        assert applied == len(live)
        rebuilt = [
            dict(r) for r in await store.fetch("SELECT * FROM audit_trail ORDER BY position")
        ]
        assert rebuilt == live, page


async def test_cli_audit_filters_by_user_experiment_and_time(
    api: Api, store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """`cairn audit --user U --experiment N --since T --json` prints that user's entries about
    that experiment; the table form shows the refusal's route and status."""
    from cairn.cli import main

    monkeypatch.setenv("CAIRN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CAIRN_USER", "admin")
    monkeypatch.setenv("CAIRN_PASSWORD", ADMIN_PASSWORD)
    bob = await user(api, store, "bob")
    await submit(store, 1)
    await submit(store, 2)
    await send(api, "PATCH", "/api/v1/experiments/1", api.admin, {"name": "one"})
    await send(api, "PATCH", "/api/v1/experiments/2", api.admin, {"name": "two"})
    await send(api, "POST", "/api/v1/experiments/1/pause", bob, {})
    await catch_up(store)
    capsys.readouterr()

    argv = ["-m", api.url, "audit", "--user", "admin", "--experiment", "1", "--since", "1h"]
    assert await asyncio.to_thread(main, [*argv, "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    assert [(e["type"], e["experiment_id"], e["actor"]) for e in entries] == [
        ("ExperimentRenamed", 1, "admin")
    ]
    assert await asyncio.to_thread(main, ["-m", api.url, "audit", "--user", "bob"]) == 0
    out = capsys.readouterr().out
    assert "RequestRejected" in out and "POST /api/v1/experiments/1/pause 403" in out
    assert await asyncio.to_thread(main, ["-m", api.url, "audit", "--since", "noon"]) != 0
    assert "not a time" in capsys.readouterr().err
