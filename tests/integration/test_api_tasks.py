"""Command tasks through the API: a user's tasks are theirs alone, bad input is a 4xx naming its
field, and only the agent holding a task's allocation reads its spec and reports for it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.domain.names import task_allocation_id, task_stream
from events.domain.types import TaskAllocated
from events.log.store import EventStore
from tests.integration.test_api_ownership import login
from tests.integration.test_api_support import Api, running_api, types_of


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def submit(api: Api, token: str, *argv: str) -> str:
    body = await api.ok("POST", "/api/v1/commands", token=token, json={"argv": list(argv)})
    assert body["state"] == "QUEUED" and body["kind"] == "command"
    return str(body["id"])


async def test_another_users_task_is_forbidden_and_admins_see_all(api: Api) -> None:
    """Bob gets 403 on Alice's task (describe, logs, kill) and does not list it; Alice and an
    admin do."""
    alice, bob = await login(api, "alice"), await login(api, "bob")
    task_id = await submit(api, alice, "python", "prep.py")
    for method, path in (
        ("GET", f"/api/v1/tasks/{task_id}"),
        ("GET", f"/api/v1/tasks/{task_id}/logs"),
        ("POST", f"/api/v1/tasks/{task_id}/kill"),
    ):
        status, body = await api.call(method, path, token=bob)
        assert status == 403, (method, path, status, body)
    assert (await api.ok("GET", "/api/v1/tasks", token=bob))["tasks"] == []
    mine = await api.ok("GET", "/api/v1/tasks", token=alice)
    assert [t["id"] for t in mine["tasks"]] == [task_id]
    everyone = await api.ok("GET", "/api/v1/tasks", token=api.admin)
    assert task_id in [t["id"] for t in everyone["tasks"]]
    assert (await api.ok("GET", f"/api/v1/tasks/{task_id}", token=alice))["owner"] == "alice"
    status, _ = await api.call("GET", "/api/v1/tasks/0000000000000000", token=alice)
    assert status == 404


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"argv": ["true"], "config": {"resources": {"slots": -1}}}, "config.resources.slots"),
        ({"argv": ["true"], "config": {"resources": {"priorty": 3}}}, "config.resources.priorty"),
        ({"argv": []}, "argv"),
        ({"argv": ["x"] * 5000}, "argv"),
        ({"argv": ["true"], "code": "not base64!"}, "code"),
        ({"argv": ["true"], "bogus": 1}, "bogus"),
    ],
)
async def test_malformed_command_is_a_400_naming_the_field(
    api: Api, store: EventStore, body: dict[str, object], path: str
) -> None:
    """A bad config, argv or context is refused with 400 and the offending field's path, and
    nothing is appended."""
    alice = await login(api, "alice")
    status, answer = await api.call("POST", "/api/v1/commands", token=alice, json=body)
    assert status == 400, (status, answer)
    assert answer["error"]["path"] == path
    assert [e async for e in store.iter_all(0, types=["TaskRequested"])] == []


async def test_only_the_agent_holding_a_task_runs_it_and_its_exit_and_output_reach_the_owner(
    api: Api, store: EventStore
) -> None:
    """The placed agent gets the spec (no token, the owner's identity) and reports start, output
    and exit 3; another agent gets 403; the owner reads the output and the exit code."""
    alice = await login(api, "alice")
    task_id = await submit(api, alice, "python", "prep.py")
    alloc = task_allocation_id(task_id)
    await store.append(
        task_stream(task_id),
        [TaskAllocated(task_id=task_id, allocation_id=alloc, placements={"gpu01": ["0"]})],
        expected_version=1,
    )
    agent = await api.agent_token("gpu01")
    other = await api.agent_token("gpu02")
    base = f"/api/v1/allocations/{alloc}"
    status, _ = await api.call("GET", f"{base}/spec", token=other)
    assert status == 403
    spec = await api.ok("GET", f"{base}/spec?agent_id=gpu01", token=agent)
    assert (spec["task_id"], spec["entrypoint"], spec["token"]) == (
        task_id,
        ["python", "prep.py"],
        "",
    )
    assert spec["agent_user_group"]["agent_uid"] != 0
    await api.ok("POST", f"{base}/started", token=agent, json={"agent_id": "gpu01"})
    lines = {"lines": [{"line": "prepared 42 shards"}], "idempotency_key": "k1"}
    assert (await api.ok("POST", f"{base}/logs", token=agent, json=lines))["inserted"] == 1
    status, _ = await api.call("POST", f"{base}/logs", token=other, json=lines)
    assert status == 403
    exited = {"agent_id": "gpu01", "exit_code": 3}
    answer = await api.ok("POST", f"{base}/exited", token=agent, json=exited)
    assert answer["outcome"] == "failed"
    again = await api.ok("POST", f"{base}/exited", token=agent, json=exited)
    assert again["duplicate"] is True
    assert await types_of(store, task_stream(task_id)) == [
        "TaskRequested",
        "TaskAllocated",
        "TaskStarted",
        "TaskExited",
    ]
    task = await api.ok("GET", f"/api/v1/tasks/{task_id}", token=alice)
    assert (task["state"], task["exit_code"], task["agent_id"]) == ("TERMINATED", 3, "gpu01")
    logs = await api.ok("GET", f"/api/v1/tasks/{task_id}/logs", token=alice)
    assert [line["line"] for line in logs["logs"]] == ["prepared 42 shards"]
    assert logs["done"] is True


async def test_a_shell_is_its_owners_and_its_placed_agent_alone_gets_its_serving_token(
    api: Api, store: EventStore
) -> None:
    """POST /api/v1/shells records a shell (a proxy path, not ready); a bad config is a 400
    naming the field with nothing appended; another user gets 403 on it; the placed agent's
    spec says ``shell`` and carries a serving token, which no answer to the owner shows."""
    alice, bob = await login(api, "alice"), await login(api, "bob")
    status, answer = await api.call(
        "POST", "/api/v1/shells", token=alice, json={"config": {"idle_timeout": "soon"}}
    )
    assert status == 400 and answer["error"]["path"] == "config.idle_timeout", answer
    assert [e async for e in store.iter_all(0, types=["TaskRequested"])] == []
    status, answer = await api.call("POST", "/api/v1/shells", token=alice, json={"argv": ["sh"]})
    assert status == 400 and answer["error"]["path"] == "argv", answer

    body = await api.ok(
        "POST", "/api/v1/shells", token=alice, json={"config": {"resources": {"slots": 0}}}
    )
    task_id = body["id"]
    assert (body["kind"], body["state"], body["ready"]) == ("shell", "QUEUED", False)
    assert body["proxy_path"] == f"/proxy/{task_id}/" and body["argv"] == []
    status, _ = await api.call("GET", f"/api/v1/tasks/{task_id}", token=bob)
    assert status == 403

    alloc = task_allocation_id(task_id)
    await store.append(
        task_stream(task_id),
        [TaskAllocated(task_id=task_id, allocation_id=alloc, placements={"gpu01": []})],
        expected_version=1,
    )
    agent = await api.agent_token("gpu01")
    spec = await api.ok("GET", f"/api/v1/allocations/{alloc}/spec?agent_id=gpu01", token=agent)
    assert spec["task_kind"] == "shell" and spec["token"] == ""
    assert len(spec["serve_token"]) == 64
    shown = await api.ok("GET", f"/api/v1/tasks/{task_id}", token=alice)
    assert spec["serve_token"] not in json.dumps(shown)
