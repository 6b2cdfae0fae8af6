"""Tasks in workspaces on the real API: a task is started in a workspace (by id or name), whose
roles decide who else sees, kills or opens it; its pool must serve that workspace; a workspace
holding a task that has not ended is not deleted; a task requested before workspaces existed
is in the default one."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cairn.cli import main as cli_main
from events.domain.names import task_stream
from events.domain.types import TaskExited
from events.log.store import EventStore
from tests.helpers import cli_env
from tests.integration.test_api_support import Api, running_api
from tests.integration.test_api_teams import created, grant, user
from tests.integration.test_legacy_trial_ids import fixture, insert

API_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")
"""A line the API running in the test's process logs (structlog's console format)."""


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def start(api: Api, token: str, kind: str, workspace: Any = None) -> dict[str, Any]:
    """Starts a task of ``kind`` (``command`` or ``notebook``) in ``workspace``; returns it."""
    body: dict[str, Any] = {"config": {"resources": {"slots": 0}}}
    if kind == "command":
        body["argv"] = ["python", "prep.py"]
    if workspace is not None:
        body["workspace"] = workspace
    return dict(await created(api, "POST", f"/api/v1/{kind}s", token, body))


async def listed(api: Api, token: str, query: str = "") -> list[str]:
    return [t["id"] for t in (await api.ok("GET", f"/api/v1/tasks{query}", token=token))["tasks"]]


async def test_roles_in_a_tasks_workspace_decide_who_sees_kills_and_opens_it(api: Api) -> None:
    """In workspace A, a Viewer sees the owner's tasks (describe, logs, list) but cannot kill
    or open them (403), an Editor kills and opens them, an Editor of B sees nothing of A's (403,
    not listed), an admin sees and filters all; tasks in the default workspace stay their
    owner's."""
    a = await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "a"})
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "b"})
    owner, viewer, editor, stranger = [await user(api, n) for n in ("olga", "vic", "edna", "sam")]
    await grant(api, "Editor", "olga", "a")
    await grant(api, "Viewer", "vic", "a")
    await grant(api, "Editor", "edna", "a")
    await grant(api, "Editor", "sam", "b")
    command = await start(api, owner, "command", "a")
    notebook = await start(api, owner, "notebook", a["id"])
    assert (command["workspace"], notebook["workspace"]) == ("a", "a")
    assert notebook["workspace_id"] == a["id"]
    in_default = await start(api, owner, "command")
    assert (in_default["workspace_id"], in_default["workspace"]) == (1, "Uncategorized")
    in_a = [command["id"], notebook["id"]]

    for task_id in in_a:
        assert (await api.ok("GET", f"/api/v1/tasks/{task_id}", token=viewer))["owner"] == "olga"
        await api.ok("GET", f"/api/v1/tasks/{task_id}/logs", token=viewer)
    assert await listed(api, viewer) == in_a
    status, answer = await api.call("POST", f"/api/v1/tasks/{command['id']}/kill", token=viewer)
    assert status == 403 and "update_nsc" in answer["error"]["message"], answer
    status, answer = await api.call("GET", f"/proxy/{notebook['id']}/lab", token=viewer)
    assert status == 403 and "update_nsc" in answer["error"]["message"], answer

    # An Editor passes the proxy's authorization (the notebook is not serving yet: 502).
    status, answer = await api.call("GET", f"/proxy/{notebook['id']}/lab", token=editor)
    assert status == 502 and "not ready" in answer["error"]["message"], answer
    killed = await api.ok("POST", f"/api/v1/tasks/{command['id']}/kill", token=editor)
    assert killed["changed"]

    for task_id in [*in_a, in_default["id"]]:
        for method, path in (
            ("GET", f"/api/v1/tasks/{task_id}"),
            ("GET", f"/api/v1/tasks/{task_id}/logs"),
            ("POST", f"/api/v1/tasks/{task_id}/kill"),
            ("GET", f"/proxy/{task_id}/lab"),
        ):
            status, answer = await api.call(method, path, token=stranger)
            assert status == 403, (method, path, status, answer)
    assert await listed(api, stranger) == []
    assert await listed(api, stranger, f"?workspace_id={a['id']}") == []
    status, _ = await api.call("GET", f"/api/v1/tasks/{in_default['id']}", token=viewer)
    assert status == 403

    assert await listed(api, owner) == [*in_a, in_default["id"]]
    assert await listed(api, api.admin, f"?workspace_id={a['id']}") == in_a
    assert await listed(api, api.admin, "?workspace_id=1") == [in_default["id"]]
    status, answer = await api.call("GET", "/api/v1/tasks?workspace_id=x", token=api.admin)
    assert status == 400 and answer["error"]["path"] == "workspace_id", answer


async def test_a_task_goes_only_where_it_may(api: Api) -> None:
    """An unknown workspace (by name or id) or a malformed one is a 400 naming ``workspace``,
    an archived one a 409, one where the caller may not start tasks (a Viewer, a stranger) a
    403; a pool bound to a workspace takes its tasks and refuses the default workspace's (400
    naming ``resources.resource_pool``); nothing refused is appended."""
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "vision"})
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "old"})
    await api.ok("POST", "/api/v1/workspaces/old/archive", token=api.admin, json={})
    ivy, vic = await user(api, "ivy"), await user(api, "vic")
    await grant(api, "Editor", "ivy", "vision")
    await grant(api, "Viewer", "vic", "vision")
    await api.ok(
        "POST", "/api/v1/resource-pools/gpu/workspace-bindings", token=api.admin,
        json={"workspace_names": ["vision"]},
    )  # fmt: skip
    on_gpu = {"resources": {"slots": 0, "resource_pool": "gpu"}}
    before = await listed(api, api.admin)

    cases: list[tuple[str, dict[str, Any], int, str | None]] = [
        (ivy, {"workspace": "atlantis"}, 400, "workspace"),
        (ivy, {"workspace": 999}, 400, "workspace"),
        (ivy, {"workspace": "999"}, 400, "workspace"),
        (ivy, {"workspace": True}, 400, "workspace"),
        (ivy, {"workspace": ["vision"]}, 400, "workspace"),
        (api.admin, {"workspace": "old"}, 409, None),
        (vic, {"workspace": "vision"}, 403, None),
        (ivy, {"config": on_gpu}, 400, "resources.resource_pool"),
    ]
    for token, body, expected, path in cases:
        for kind, extra in (("command", {"argv": ["true"]}), ("notebook", {})):
            status, answer = await api.call(
                "POST", f"/api/v1/{kind}s", token=token, json={**extra, **body}
            )
            assert status == expected, (kind, body, status, answer)
            if path is not None:
                assert answer["error"]["path"] == path, (kind, body, answer)
    status, answer = await api.call(
        "POST", "/api/v1/tensorboards", token=ivy,
        json={"experiment_ids": [1], "workspace": "atlantis"},
    )  # fmt: skip
    assert status == 400 and answer["error"]["path"] == "workspace", answer
    assert await listed(api, api.admin) == before

    inside = await created(
        api, "POST", "/api/v1/notebooks", ivy, {"config": on_gpu, "workspace": "vision"}
    )
    assert (
        inside["workspace"] == "vision" and inside["config"]["resources"]["resource_pool"] == "gpu"
    )


async def test_a_workspace_holding_a_live_task_is_not_deleted(api: Api, store: EventStore) -> None:
    """Deleting a workspace whose notebook has not ended is refused with a 409 naming the
    task; once it ended (canceled by the scheduler after a kill), the workspace is deleted."""
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "lab"})
    notebook = await start(api, api.admin, "notebook", "lab")
    status, answer = await api.call("DELETE", "/api/v1/workspaces/lab", token=api.admin)
    assert status == 409, answer
    assert f"notebook {notebook['id']}" in answer["error"]["message"], answer

    await api.ok("POST", f"/api/v1/tasks/{notebook['id']}/kill", token=api.admin)
    # What the scheduler appends for a task killed before it was placed.
    await store.append(
        task_stream(notebook["id"]),
        [TaskExited(task_id=notebook["id"], outcome="canceled", message="killed before it ran")],
    )
    deleted = await api.ok("DELETE", "/api/v1/workspaces/lab", token=api.admin)
    assert deleted["deleted"]
    ended = await api.ok("GET", f"/api/v1/tasks/{notebook['id']}", token=api.admin)
    assert (ended["state"], ended["workspace"]) == ("TERMINATED", "")


async def test_a_task_requested_before_workspaces_is_in_the_default_one(
    api: Api, store: EventStore
) -> None:
    """Old TaskRequested payloads (versions 1 and 2, stored as an old cairn wrote them) are
    read as tasks of the default workspace: their owner and admins see them there, a Viewer of
    another workspace does not."""
    old_command = fixture("TaskRequested", 1)
    old_board = fixture("TaskRequested", 2)
    await insert(store, task_stream(old_command[2]["task_id"]), old_command)
    await insert(store, task_stream(old_board[2]["task_id"]), old_board)
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "a"})
    alice, vic = await user(api, "alice"), await user(api, "vic")
    await grant(api, "Viewer", "vic", "a")
    for _, _, payload in (old_command, old_board):
        task = await api.ok("GET", f"/api/v1/tasks/{payload['task_id']}", token=alice)
        assert (task["workspace_id"], task["workspace"]) == (1, "Uncategorized"), task
    ids = [old_command[2]["task_id"], old_board[2]["task_id"]]
    assert await listed(api, alice, "?workspace_id=1") == ids
    assert await listed(api, vic) == []


async def test_the_cli_starts_tasks_in_a_workspace_and_lists_by_workspace(
    api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``cairn cmd run -w``, ``notebook start -w`` and ``tensorboard start -w`` (detached) put
    the task in that workspace; ``cmd list``, ``notebook list`` and ``task list`` show a
    workspace column and take ``-w``; an unknown workspace is a clear error."""
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "vision"})
    cli_env(monkeypatch, tmp_path / "home", api.url)

    def run(*args: str) -> tuple[int, str]:
        """Runs the CLI; its exit code and what it printed (without the in-process API's log
        lines)."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = cli_main(list(args))
        lines = out.getvalue().splitlines()
        return code, "\n".join(line for line in lines if not API_LOG_LINE.match(line))

    code, out = await asyncio.to_thread(
        run, "cmd", "run", "-d", "-w", "vision", "--config", "resources.slots=0", "true"
    )
    assert code == 0, out
    command = out.strip()
    code, out = await asyncio.to_thread(run, "notebook", "start", "-d", "--workspace", "vision")
    assert code == 0, out
    notebook = out.strip()
    code, out = await asyncio.to_thread(run, "notebook", "start", "-d")
    assert code == 0, out
    uncategorized = out.strip()
    for task_id in (command, notebook):
        assert (await api.ok("GET", f"/api/v1/tasks/{task_id}", token=api.admin))[
            "workspace"
        ] == "vision"

    code, out = await asyncio.to_thread(run, "task", "list", "-w", "vision")
    assert code == 0 and "workspace" in out.strip().splitlines()[0], out
    assert command in out and notebook in out and uncategorized not in out, out
    code, out = await asyncio.to_thread(run, "notebook", "list")
    assert code == 0 and notebook in out and uncategorized in out and command not in out, out
    assert "vision" in out and "Uncategorized" in out, out
    code, out = await asyncio.to_thread(run, "--json", "cmd", "list", "-w", "Uncategorized")
    assert code == 0 and [t["id"] for t in json.loads(out)["tasks"]] == [uncategorized], out
    code, out = await asyncio.to_thread(run, "cmd", "describe", command)
    assert code == 0 and "vision" in out, out

    code, out = await asyncio.to_thread(run, "notebook", "start", "-d", "-w", "atlantis")
    assert code != 0 and "no workspace 'atlantis'" in out, out
    code, out = await asyncio.to_thread(run, "tensorboard", "start", "-d", "-w", "atlantis", "1")
    assert code != 0 and "no workspace 'atlantis'" in out, out
    code, out = await asyncio.to_thread(run, "task", "list", "-w", "atlantis")
    assert code != 0 and "atlantis" in out, out
