"""Models in workspaces over real HTTP on a real PostgreSQL: a model is created in a workspace
and obeys its roles (a Viewer reads and changes nothing, a user without a grant sees none of
it), moves between workspaces only with the right to take it out and put it in, lists filter by
workspace, a workspace that holds a model is not deleted, and a model of the old log (created
before workspaces) is in the default one."""

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
from cairn.experimental.client import Determined
from events.log.store import EventStore
from tests.helpers import cli_env
from tests.integration.test_api_models import alices_experiment, status_of
from tests.integration.test_api_support import Api, running_api, types_of
from tests.integration.test_api_teams import created, grant, user
from tests.integration.test_legacy_trial_ids import fixture, insert


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def workspace(api: Api, name: str) -> int:
    """Creates workspace ``name`` as the admin; returns its id."""
    return int((await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": name}))["id"])


async def names(api: Api, token: str, query: str = "") -> list[str]:
    """The names of the models the caller lists (with ``query``), by name."""
    listed = await api.ok("GET", f"/api/v1/models?sort_by=name{query}", token=token)
    return [m["name"] for m in listed["models"]]


async def refusal(api: Api, method: str, path: str, token: str, body: Any) -> tuple[int, Any]:
    status, answer = await api.call(method, path, token=token, json=body)
    return status, answer.get("error") if isinstance(answer, dict) else answer


async def test_a_workspaces_roles_decide_who_reads_and_changes_its_models(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """An Editor of A creates a model in A and registers a version; a Viewer of A reads the
    model and its versions but every change is 403; users without a grant on B neither list
    nor read B's model (403, as for B's experiments) and cannot create there; an unknown workspace
    is 400 naming the field, an archived one 409."""
    alice, bob, c1, _ = await alices_experiment(api, store, tmp_path / "checkpoints")
    a, b = await workspace(api, "a"), await workspace(api, "b")
    vic = await user(api, "vic")
    await grant(api, "Editor", "alice", "a")
    await grant(api, "Viewer", "vic", "a")

    model = await api.ok(
        "POST", "/api/v1/models", token=alice, json={"name": "in-a", "workspace_name": "a"}
    )
    assert (model["workspace"], model["workspace_id"]) == ("a", a)
    await api.ok("POST", "/api/v1/models/in-a/versions", token=alice, json={"checkpoint_uuid": c1})
    in_b = {"name": "in-b", "workspace_id": b}
    assert (await api.ok("POST", "/api/v1/models", token=api.admin, json=in_b))["workspace"] == "b"
    await api.ok("POST", "/api/v1/models", token=bob, json={"name": "bobs"})  # Uncategorized

    seen = await api.ok("GET", "/api/v1/models/in-a", token=vic)
    assert (seen["username"], seen["workspace"]) == ("alice", "a")
    versions = await api.ok("GET", "/api/v1/models/in-a/versions", token=vic)
    assert [v["version"] for v in versions["model_versions"]] == [1]
    assert (await api.ok("GET", "/api/v1/models/in-a/versions/-1", token=vic))["version"] == 1
    before = await types_of(store, "model-1")
    for method, path, body in (
        ("PATCH", "/api/v1/models/in-a", {"description": "mine now"}),
        ("POST", "/api/v1/models/in-a/archive", {}),
        ("DELETE", "/api/v1/models/in-a", None),
        ("POST", "/api/v1/models/in-a/versions", {"checkpoint_uuid": c1}),
        ("PATCH", "/api/v1/models/in-a/versions/1", {"comment": "x"}),
        ("DELETE", "/api/v1/models/in-a/versions/1", None),
        ("POST", "/api/v1/models/in-a/move", {"workspace_name": "Uncategorized"}),
        ("POST", "/api/v1/models", {"name": "vics", "workspace_name": "a"}),
    ):
        status, error = await refusal(api, method, path, vic, body)
        assert status == 403, (method, path, status, error)
    assert await types_of(store, "model-1") == before

    assert await names(api, vic) == ["bobs", "in-a"]
    assert await names(api, bob) == ["bobs"]
    assert await names(api, api.admin) == ["bobs", "in-a", "in-b"]
    for token in (vic, bob, alice):
        for path in ("/api/v1/models/in-b", "/api/v1/models/in-b/versions"):
            assert await status_of(api, "GET", path, token) == 403, (path, token)
    for token, where in ((bob, "a"), (alice, "b")):
        body = {"name": f"new-in-{where}", "workspace_name": where}
        status, error = await refusal(api, "POST", "/api/v1/models", token, body)
        assert status == 403 and "create_model_registry" in error["message"], error

    for body, path in (
        ({"name": "x", "workspace_name": "nowhere"}, "workspace_name"),
        ({"name": "x", "workspace_id": 999}, "workspace_id"),
        ({"name": "x", "workspace_id": a, "workspace_name": "a"}, "workspace_name"),
    ):
        status, error = await refusal(api, "POST", "/api/v1/models", alice, body)
        assert status == 400 and error["path"] == path, (body, error)
    await api.ok("POST", "/api/v1/workspaces/b/archive", token=api.admin, json={})
    status, error = await refusal(
        api, "POST", "/api/v1/models", api.admin, {"name": "late", "workspace_name": "b"}
    )
    assert status == 409 and "archived" in error["message"], error


async def test_a_model_moves_only_with_both_rights_and_lists_filter_by_workspace(
    api: Api, store: EventStore
) -> None:
    """Moving needs the right to delete the model where it is and to create models where it
    goes (403 otherwise, nothing appended); a move appends ModelMoved and the model answers
    from its new workspace; lists filter by workspace names and ids; an unknown workspace is
    400, an archived one 409; a workspace is not deleted (409 naming the model) until its
    model moves out."""
    a, b = await workspace(api, "a"), await workspace(api, "b")
    await workspace(api, "shut")
    edna, vic = await user(api, "edna"), await user(api, "vic")
    await grant(api, "Editor", "edna", "a")
    await grant(api, "Viewer", "edna", "b")
    await grant(api, "Editor", "vic", "b")
    await grant(api, "Viewer", "vic", "a")
    await api.ok("POST", "/api/v1/models", token=edna, json={"name": "m", "workspace_id": a})

    to_b = {"workspace_name": "b"}
    status, error = await refusal(api, "POST", "/api/v1/models/m/move", edna, to_b)
    assert status == 403 and "create_model_registry" in error["message"], error
    status, error = await refusal(api, "POST", "/api/v1/models/m/move", vic, to_b)
    assert status == 403 and "delete_model_registry" in error["message"], error
    assert await types_of(store, "model-1") == ["ModelCreated"]

    await grant(api, "Editor", "edna", "b")
    moved = await api.ok("POST", "/api/v1/models/m/move", token=edna, json=to_b)
    assert (moved["workspace"], moved["workspace_id"]) == ("b", b)
    assert await types_of(store, "model-1") == ["ModelCreated", "ModelMoved"]
    again = await api.ok("POST", "/api/v1/models/m/move", token=edna, json={"workspace_name": "b"})
    assert again["workspace_id"] == b
    assert await types_of(store, "model-1") == ["ModelCreated", "ModelMoved"]
    await api.ok("PATCH", "/api/v1/models/m", token=vic, json={"notes": "an Editor of b now"})

    await api.ok("POST", "/api/v1/models", token=api.admin, json={"name": "stays"})
    assert await names(api, api.admin, "&workspace_names=b") == ["m"]
    assert await names(api, api.admin, "&workspace_names=a,Uncategorized") == ["stays"]
    assert await names(api, api.admin, f"&workspace_ids={b},1") == ["m", "stays"]
    assert await names(api, api.admin, f"&workspace_ids={a}") == []
    listed = await api.ok("GET", "/api/v1/models?workspace_names=b", token=edna)
    assert [(m["workspace"], m["workspace_id"]) for m in listed["models"]] == [("b", b)]
    status, error = await refusal(api, "GET", "/api/v1/models?workspace_ids=1,x", edna, None)
    assert status == 400 and error["path"] == "workspace_ids", error

    for body, path in (
        ({"workspace_name": "nowhere"}, "workspace_name"),
        ({"destination_workspace_id": 999}, "destination_workspace_id"),
        ({}, "destination_workspace_id"),
        ({"workspace_name": "b", "colour": "red"}, None),
    ):
        status, error = await refusal(api, "POST", "/api/v1/models/m/move", edna, body)
        assert status == 400 and (path is None or error["path"] == path), (body, error)
    await api.ok("POST", "/api/v1/workspaces/shut/archive", token=api.admin, json={})
    status, error = await refusal(
        api, "POST", "/api/v1/models/m/move", api.admin, {"workspace_name": "shut"}
    )
    assert status == 409 and "archived" in error["message"], error

    status, error = await refusal(api, "DELETE", "/api/v1/workspaces/b", api.admin, None)
    assert status == 409 and "1 model(s) ('m')" in error["message"], error
    back = {"destination_workspace_id": 1}
    assert (await api.ok("POST", "/api/v1/models/m/move", token=edna, json=back))["workspace"] == (
        "Uncategorized"
    )
    deleted = await api.ok("DELETE", "/api/v1/workspaces/b", token=api.admin)
    assert deleted["deleted"] is True


async def test_a_model_of_the_old_log_is_in_the_default_workspace_and_moves(
    api: Api, store: EventStore
) -> None:
    """A ModelCreated stored at version 1 (workspace by name, always "Uncategorized") reads as
    in workspace 1, every user reads it, and it moves like a new one."""
    await insert(store, "model-1", fixture("ModelCreated", 1))
    ana = await user(api, "ana")
    old = await api.ok("GET", "/api/v1/models/mnist classifier", token=ana)
    assert (old["workspace_id"], old["workspace"], old["username"]) == (1, "Uncategorized", "alice")
    assert await names(api, ana, "&workspace_names=Uncategorized") == ["mnist classifier"]
    lab = await workspace(api, "lab")
    moved = await api.ok(
        "POST", "/api/v1/models/1/move", token=api.admin, json={"destination_workspace_id": lab}
    )
    assert moved["workspace"] == "lab"
    assert await status_of(api, "GET", "/api/v1/models/1", ana) == 403
    assert await names(api, ana) == []
    new = await api.ok("POST", "/api/v1/models", token=ana, json={"name": "next"})
    assert new["id"] == 2 and new["workspace_id"] == 1


SERVER_LOG = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[")
"""A line the gateway (serving in this process) logs while the CLI's output is captured."""


def run_cli(*args: str) -> tuple[int, str]:
    """Runs ``cairn ARGS`` in this process; its exit code and what it printed (without the
    gateway's log lines)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli_main(list(args))
    lines = out.getvalue().splitlines(keepends=True)
    return code, "".join(line for line in lines if not SERVER_LOG.match(line))


def sdk_moves(url: str, password: str) -> list[Any]:
    """What the SDK sees as ``edna`` creating a model in ``a`` and moving it to ``b``."""
    client = Determined(master=url, user="edna", password=password)
    model = client.create_model("sdk model", description="by the SDK", workspace_name="a")
    seen: list[Any] = [model.workspace_id, model.workspace]
    seen.append([m.name for m in client.get_models(workspace_names=["a"])])
    model.move_to_workspace("b")
    seen += [model.workspace_id, model.workspace]
    seen.append([m.name for m in client.get_models(workspace_names=["a"])])
    seen.append(client.get_model("sdk model").workspace_id)
    return seen


async def test_the_cli_and_the_sdk_create_list_and_move_models_between_workspaces(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cairn model create --workspace-name``, ``model list --workspace-names`` (with a
    WORKSPACE column) and ``model move``; a refused move exits non-zero naming the permission;
    the SDK's ``create_model(workspace_name=)``, ``get_models(workspace_names=)``,
    ``Model.move_to_workspace`` and ``Model.workspace_id`` do the same."""
    a, b = await workspace(api, "a"), await workspace(api, "b")
    await user(api, "edna")
    await grant(api, "Editor", "edna", "a")
    await grant(api, "Editor", "edna", "b")
    cli_env(monkeypatch, tmp_path / "home", api.url, "edna", "edna-password-1")

    code, out = await asyncio.to_thread(
        run_cli, "model", "create", "cli model", "--workspace-name", "a", "--json"
    )
    assert code == 0 and json.loads(out)["workspace_id"] == a, out
    code, out = await asyncio.to_thread(run_cli, "model", "list", "--workspace-names", "a")
    assert code == 0 and "WORKSPACE" in out and "cli model" in out, out
    code, out = await asyncio.to_thread(run_cli, "model", "move", "cli model", "-w", "b")
    assert code == 0 and "is in workspace 'b'" in out, out
    code, out = await asyncio.to_thread(run_cli, "m", "ls", "-w", "a", "--json")
    assert code == 0 and json.loads(out)["models"] == [], out
    code, out = await asyncio.to_thread(run_cli, "m", "ls", "-w", "b", "--json")
    assert [m["workspace"] for m in json.loads(out)["models"]] == ["b"], out
    await api.ok("POST", "/api/v1/roles/remove-assignments", token=api.admin,
                 json={"role_name": "Editor", "username": "edna", "workspace": "a"})  # fmt: skip
    code, out = await asyncio.to_thread(run_cli, "model", "move", "cli model", "-w", "a")
    assert code != 0 and "create_model_registry" in out, out
    await grant(api, "Editor", "edna", "a")

    seen = await asyncio.to_thread(sdk_moves, api.url, "edna-password-1")
    assert seen == [a, "a", ["sdk model"], b, "b", [], b]
