"""Workspaces, projects and roles on the real API: experiments live in projects, a generated
matrix of (role by action) holds on every route it covers (tasks included), an Editor of one
workspace sees nothing of another, and time travel shows where an experiment was."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from events.domain.authorization import ROLES, Permission, cluster_wide
from events.log.store import EventStore
from services.tracker.service import catch_up
from tests.integration.test_api_support import CONFIG, Api, running_api

P = Permission


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def user(api: Api, name: str) -> str:
    """Creates the non-admin user ``name``; returns their token."""
    password = f"{name}-password-1"
    await api.ok(
        "POST", "/api/v1/users", token=api.admin, json={"username": name, "password": password}
    )
    return await api.login(name, password)


async def created(api: Api, method: str, path: str, token: str, body: Any) -> Any:
    status, answer = await api.call(method, path, token=token, json=body)
    assert status in (200, 201), (status, answer)
    return answer


def in_project(workspace: str, project: str, name: str = "exp") -> str:
    return CONFIG.replace(
        "name: mnist", f"name: {name}\nworkspace: {workspace}\nproject: {project}"
    )


async def grant(api: Api, role: str, username: str, workspace: str | None) -> None:
    body: dict[str, Any] = {"role_name": role, "username": username}
    if workspace is not None:
        body["workspace"] = workspace
    answer = await api.ok("POST", "/api/v1/roles/add-assignments", token=api.admin, json=body)
    assert answer["changed"], answer


async def test_experiments_live_in_projects_and_move(api: Api, store: EventStore) -> None:
    """An experiment created with workspace/project in its config lands there (the list filters
    by project), a project holding one is not deleted (409), a move is recorded and time travel
    shows the experiment where it was; the default workspace never changes."""
    ws = await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "vision"})
    assert ws["name"] == "vision" and not ws["immutable"]
    status, _ = await api.call(
        "POST", "/api/v1/workspaces", token=api.admin, json={"name": "vision"}
    )
    assert status == 409
    project = await created(
        api, "POST", "/api/v1/workspaces/vision/projects", api.admin, {"name": "detection"}
    )
    exp = await created(
        api, "POST", "/api/v1/experiments", api.admin,
        {"config": in_project("vision", "detection"), "activate": False},
    )  # fmt: skip
    detail = await api.ok("GET", f"/api/v1/experiments/{exp['id']}", token=api.admin)
    assert (detail["workspace"], detail["project"]) == ("vision", "detection")
    before_move = await store.head()

    await catch_up(store)
    listed = await api.ok(
        "GET", f"/api/v1/experiments?project_id={project['id']}&archived=all", token=api.admin
    )
    assert [e["id"] for e in listed["experiments"]] == [exp["id"]]
    status, refusal = await api.call("DELETE", f"/api/v1/projects/{project['id']}", token=api.admin)
    assert status == 409 and "1 experiment" in refusal["error"]["message"], refusal

    moved = await api.ok(
        "POST", f"/api/v1/experiments/{exp['id']}/move", token=api.admin,
        json={"destination_project_id": 1},
    )  # fmt: skip
    assert moved["moved"]
    now = await api.ok("GET", f"/api/v1/experiments/{exp['id']}", token=api.admin)
    assert (now["workspace"], now["project"]) == ("Uncategorized", "Uncategorized")
    then = await api.ok("GET", f"/api/v1/experiments/{exp['id']}?at={before_move}", token=api.admin)
    assert (then["workspace"], then["project"]) == ("vision", "detection")

    await catch_up(store)
    await api.ok("DELETE", f"/api/v1/projects/{project['id']}", token=api.admin)
    await api.ok("DELETE", "/api/v1/workspaces/vision", token=api.admin)
    status, _ = await api.call("GET", "/api/v1/workspaces/vision", token=api.admin)
    assert status == 404
    for method, path, body in (
        ("PATCH", "/api/v1/workspaces/1", {"name": "Renamed"}),
        ("POST", "/api/v1/workspaces/1/archive", None),
        ("DELETE", "/api/v1/workspaces/1", None),
        ("DELETE", "/api/v1/projects/1", None),
    ):
        status, refusal = await api.call(method, path, token=api.admin, json=body)
        assert status == 409 and "default" in refusal["error"]["message"], (path, refusal)


async def test_hostile_team_requests_are_clear_4xx(api: Api) -> None:
    """Bad names, unknown roles, a cluster-only role on a workspace, unknown users, groups and
    workspaces, and a config naming only one of workspace/project are each a clear 4xx."""
    bad_names = ["", "   ", "x" * 81, "tab\there", " lead"]
    for name in bad_names:
        status, answer = await api.call(
            "POST", "/api/v1/workspaces", token=api.admin, json={"name": name}
        )
        assert status == 400 and answer["error"].get("path") == "name", (name, answer)
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "nlp"})
    await user(api, "ivy")
    cases = [
        ({"role_name": "Overlord", "username": "ivy"}, 400),
        ({"role_name": "ClusterAdmin", "username": "ivy", "workspace": "nlp"}, 400),
        ({"role_name": "Viewer", "username": "nobody-here"}, 400),
        ({"role_name": "Viewer", "group_name": "no-such-group"}, 404),
        ({"role_name": "Viewer", "username": "ivy", "workspace": "atlantis"}, 404),
        ({"role_name": "Viewer", "username": "ivy", "group_name": "both"}, 400),
    ]
    for body, expected in cases:
        status, answer = await api.call(
            "POST", "/api/v1/roles/add-assignments", token=api.admin, json=body
        )
        assert status == expected, (body, status, answer)
    status, answer = await api.call(
        "POST", "/api/v1/groups", token=api.admin, json={"name": "g", "add_users": ["ghost"]}
    )
    assert status == 400 and "ghost" in answer["error"]["message"]
    for method, path, body in (
        ("GET", "/api/v1/workspaces/\u00b9", None),  # a digit to str.isdigit, not to int()
        ("GET", "/api/v1/groups/\u00b2", None),
        ("POST", "/api/v1/resource-pools/gpu/workspace-bindings", {"workspace_names": ["\u00b9"]}),
    ):
        status, answer = await api.call(method, path, token=api.admin, json=body)
        assert status == 404, (path, status, answer)
    status, answer = await api.call(
        "PUT", "/api/v1/resource-pools/a%07b/workspace-bindings", token=api.admin,
        json={"workspace_names": []},
    )  # fmt: skip
    assert status == 400 and answer["error"]["path"] == "pool", answer
    half = CONFIG.replace("name: mnist", "name: half\nworkspace: nlp")
    status, answer = await api.call(
        "POST", "/api/v1/experiments", token=api.admin, json={"config": half}
    )
    assert status == 400 and answer["error"]["path"] == "project", answer


ACTIONS: list[tuple[str, Permission]] = [
    ("read the owner's experiment", P.VIEW_EXPERIMENT),
    ("list the owner's experiment", P.VIEW_EXPERIMENT),
    ("rename the owner's experiment", P.UPDATE_EXPERIMENT),
    ("delete the owner's running experiment", P.DELETE_EXPERIMENT),
    ("create an experiment in the workspace", P.CREATE_EXPERIMENT),
    ("create a project", P.CREATE_PROJECT),
    ("edit the project", P.UPDATE_PROJECT),
    ("delete the non-empty project", P.DELETE_PROJECT),
    ("see the workspace", P.VIEW_WORKSPACE),
    ("rename the workspace", P.UPDATE_WORKSPACE),
    ("delete the non-empty workspace", P.DELETE_WORKSPACE),
    ("grant a role in the workspace", P.ASSIGN_ROLES),
    ("create a workspace", P.CREATE_WORKSPACE),
    ("create a group", P.UPDATE_GROUP),
    ("read the owner's notebook", P.VIEW_TASKS),
    ("list the owner's notebook", P.VIEW_TASKS),
    ("read the owner's notebook's output", P.VIEW_TASKS),
    ("open the owner's notebook", P.UPDATE_TASKS),
    ("kill the owner's notebook", P.UPDATE_TASKS),
    ("start a task in the workspace", P.CREATE_TASKS),
    ("read the owner's model", P.VIEW_MODEL_REGISTRY),
    ("list the owner's model", P.VIEW_MODEL_REGISTRY),
    ("read the owner's model's versions", P.VIEW_MODEL_REGISTRY),
    ("create a model in the workspace", P.CREATE_MODEL_REGISTRY),
    ("edit the owner's model", P.EDIT_MODEL_REGISTRY),
    ("move the owner's model (to where it is)", P.DELETE_MODEL_REGISTRY),
]
"""What each row of the matrix does, and the permission it needs."""


async def act(api: Api, action: str, token: str, who: str, ids: dict[str, Any]) -> bool:
    """Does ``action`` as ``who``; whether it was allowed (2xx, a 409 of the state after
    authorization passed, or the proxy's 502 for a notebook not serving yet), refused (403, or
    404 for what the caller may not see)."""
    exp, project, task = ids["experiment"], ids["project"], ids["task"]
    requests: dict[str, tuple[str, str, Any]] = {
        "read the owner's experiment": ("GET", f"/api/v1/experiments/{exp}", None),
        "rename the owner's experiment": ("PATCH", f"/api/v1/experiments/{exp}", {"name": "x"}),
        "delete the owner's running experiment": ("DELETE", f"/api/v1/experiments/{exp}", None),
        "create an experiment in the workspace": (
            "POST",
            "/api/v1/experiments",
            {"config": in_project("alpha", "main", f"by-{who}"), "activate": False},
        ),
        "create a project": ("POST", "/api/v1/workspaces/alpha/projects", {"name": f"p-{who}"}),
        "edit the project": ("PATCH", f"/api/v1/projects/{project}", {"description": who}),
        "delete the non-empty project": ("DELETE", f"/api/v1/projects/{project}", None),
        "see the workspace": ("GET", "/api/v1/workspaces/alpha", None),
        "rename the workspace": ("PATCH", "/api/v1/workspaces/alpha", {"name": "alpha"}),
        "delete the non-empty workspace": ("DELETE", "/api/v1/workspaces/alpha", None),
        "grant a role in the workspace": (
            "POST",
            "/api/v1/roles/add-assignments",
            {"role_name": "Viewer", "username": "bystander", "workspace": "alpha"},
        ),
        "create a workspace": ("POST", "/api/v1/workspaces", {"name": f"ws-{who}"}),
        "create a group": ("POST", "/api/v1/groups", {"name": f"group-{who}"}),
        "read the owner's notebook": ("GET", f"/api/v1/tasks/{task}", None),
        "read the owner's notebook's output": ("GET", f"/api/v1/tasks/{task}/logs", None),
        "open the owner's notebook": ("GET", f"/proxy/{task}/lab", None),
        "kill the owner's notebook": ("POST", f"/api/v1/tasks/{task}/kill", None),
        "start a task in the workspace": (
            "POST",
            "/api/v1/commands",
            {"argv": ["true"], "workspace": "alpha", "config": {"description": who}},
        ),
        "read the owner's model": ("GET", "/api/v1/models/owned", None),
        "read the owner's model's versions": ("GET", "/api/v1/models/owned/versions", None),
        "create a model in the workspace": (
            "POST",
            "/api/v1/models",
            {"name": f"model-{who}", "workspace_name": "alpha"},
        ),
        "edit the owner's model": ("PATCH", "/api/v1/models/owned", {"notes": who}),
        "move the owner's model (to where it is)": (
            "POST",
            "/api/v1/models/owned/move",
            {"workspace_name": "alpha"},
        ),
    }
    if action == "list the owner's experiment":
        listed = await api.ok("GET", "/api/v1/experiments?archived=all", token=token)
        return exp in {e["id"] for e in listed["experiments"]}
    if action == "list the owner's notebook":
        tasks = await api.ok("GET", "/api/v1/tasks", token=token)
        return task in {t["id"] for t in tasks["tasks"]}
    if action == "list the owner's model":
        listed = await api.ok("GET", "/api/v1/models", token=token)
        return "owned" in {m["name"] for m in listed["models"]}
    method, path, body = requests[action]
    status, answer = await api.call(method, path, token=token, json=body)
    if action == "open the owner's notebook" and status == 502:
        return True
    assert status in (200, 201, 403, 404, 409), (action, who, status, answer)
    if status == 409:
        assert action.startswith("delete"), (action, who, answer)
    return status in (200, 201, 409)


async def test_generated_role_matrix(api: Api, store: EventStore) -> None:
    """Every built-in role, granted on workspace ``alpha`` (cluster-wide for the cluster-only
    ones), may do exactly the actions whose permission it holds, and a user with no role none
    of them: the matrix is generated from the roles' definitions and checked on the real API."""
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "alpha"})
    project = await created(
        api, "POST", "/api/v1/workspaces/alpha/projects", api.admin, {"name": "main"}
    )
    owner = await user(api, "owner")
    await user(api, "bystander")
    await grant(api, "Editor", "owner", "alpha")
    exp = await created(
        api, "POST", "/api/v1/experiments", owner, {"config": in_project("alpha", "main")}
    )
    notebook = await created(api, "POST", "/api/v1/notebooks", owner, {"workspace": "alpha"})
    await created(
        api, "POST", "/api/v1/models", owner, {"name": "owned", "workspace_name": "alpha"}
    )
    await catch_up(store)
    ids = {"experiment": exp["id"], "project": project["id"], "task": notebook["id"]}

    subjects: dict[str, frozenset[Permission]] = {"no-role": frozenset()}
    tokens = {"no-role": await user(api, "no-role")}
    for role, permissions in ROLES.items():
        name = f"as-{role.lower()}"
        tokens[name] = await user(api, name)
        await grant(api, role, name, None if cluster_wide(role) else "alpha")
        subjects[name] = permissions

    mismatches = []
    for name, permissions in subjects.items():
        for action, permission in ACTIONS:
            allowed = await act(api, action, tokens[name], name, ids)
            if allowed != (permission in permissions):
                mismatches.append((name, action, "allowed" if allowed else "refused"))
            await catch_up(store)
    assert mismatches == []


async def test_an_editor_of_one_workspace_sees_nothing_of_another(
    api: Api, store: EventStore
) -> None:
    """An Editor of workspace A gets 403 on an experiment in workspace B, does not find it in
    the experiment list, cannot see B (404), and a Viewer of A changes nothing in A."""
    for name in ("a", "b"):
        await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": name})
        await created(api, "POST", f"/api/v1/workspaces/{name}/projects", api.admin, {"name": "p"})
    editor, viewer = await user(api, "edna"), await user(api, "vic")
    await grant(api, "Editor", "edna", "a")
    await grant(api, "Viewer", "vic", "a")
    in_b = await created(
        api, "POST", "/api/v1/experiments", api.admin,
        {"config": in_project("b", "p"), "activate": False},
    )  # fmt: skip
    in_a = await created(
        api, "POST", "/api/v1/experiments", editor,
        {"config": in_project("a", "p"), "activate": False},
    )  # fmt: skip
    await catch_up(store)
    status, _ = await api.call("GET", f"/api/v1/experiments/{in_b['id']}", token=editor)
    assert status == 403
    listed = await api.ok("GET", "/api/v1/experiments?archived=all", token=editor)
    assert [e["id"] for e in listed["experiments"]] == [in_a["id"]]
    status, _ = await api.call("GET", "/api/v1/workspaces/b", token=editor)
    assert status == 404
    names = [
        w["name"] for w in (await api.ok("GET", "/api/v1/workspaces", token=editor))["workspaces"]
    ]
    assert names == ["Uncategorized", "a"]

    seen = await api.ok("GET", f"/api/v1/experiments/{in_a['id']}", token=viewer)
    assert seen["owner"] == "edna"
    for method, path, body in (
        ("PATCH", f"/api/v1/experiments/{in_a['id']}", {"name": "mine now"}),
        ("POST", f"/api/v1/experiments/{in_a['id']}/activate", None),
        ("POST", "/api/v1/workspaces/a/projects", {"name": "q"}),
        ("POST", f"/api/v1/experiments/{in_a['id']}/move", {"destination_project_id": 1}),
    ):
        status, answer = await api.call(method, path, token=viewer, json=body)
        assert status == 403, (path, status, answer)
    mine = await api.ok("GET", "/api/v1/permissions/summary", token=viewer)
    assert "update_experiment" not in mine["workspaces"]["a"]
    assert "view_experiment" in mine["workspaces"]["a"]


async def test_a_bound_pool_takes_only_its_workspaces_experiments(api: Api) -> None:
    """Bound to vision, pool 'gpu' refuses an uncategorized experiment and a task naming it (400
    naming the field) and a move out of vision (409), takes vision's; only admins bind (403), the default
    pool is never bound (409), and unbinding opens it again."""
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "vision"})
    await created(api, "POST", "/api/v1/workspaces/vision/projects", api.admin, {"name": "det"})
    path = "/api/v1/resource-pools/gpu/workspace-bindings"
    bound = await api.ok("POST", path, token=api.admin, json={"workspace_names": ["vision"]})
    assert bound == {"pool": "gpu", "bound": True, "workspaces": ["vision"]}
    on_gpu = CONFIG.replace("name: mnist", "name: g\nresources: {resource_pool: gpu}")
    status, answer = await api.call(
        "POST", "/api/v1/experiments", token=api.admin, json={"config": on_gpu, "activate": False}
    )
    assert status == 400 and answer["error"]["path"] == "resources.resource_pool", answer
    assert "'vision'" in answer["error"]["message"]
    status, answer = await api.call(
        "POST", "/api/v1/commands", token=api.admin,
        json={"argv": ["true"], "config": {"resources": {"resource_pool": "gpu"}}},
    )  # fmt: skip
    assert status == 400 and answer["error"]["path"] == "resources.resource_pool", answer
    inside = await created(
        api, "POST", "/api/v1/experiments", api.admin,
        {"config": on_gpu + "workspace: vision\nproject: det\n", "activate": False},
    )  # fmt: skip
    status, answer = await api.call(
        "POST", f"/api/v1/experiments/{inside['id']}/move", token=api.admin,
        json={"destination_project_id": 1},
    )  # fmt: skip
    assert status == 409 and "gpu" in answer["error"]["message"], answer
    ivy = await user(api, "ivy")
    status, _ = await api.call("PUT", path, token=ivy, json={"workspace_names": []})
    assert status == 403
    status, _ = await api.call(
        "POST", "/api/v1/resource-pools/default/workspace-bindings", token=api.admin,
        json={"workspace_names": ["vision"]},
    )  # fmt: skip
    assert status == 409
    freed = await api.ok("DELETE", path, token=api.admin, json={"workspace_names": ["vision"]})
    assert freed["bound"] is False
    await created(
        api, "POST", "/api/v1/experiments", api.admin, {"config": on_gpu, "activate": False}
    )


async def test_an_unmanaged_run_lands_in_its_configs_project(api: Api) -> None:
    """core_v2's workspace/project create the unmanaged experiment in that project; an unknown
    one is a 400 naming the field."""
    await created(api, "POST", "/api/v1/workspaces", api.admin, {"name": "laptops"})
    await created(api, "POST", "/api/v1/workspaces/laptops/projects", api.admin, {"name": "runs"})
    config = {
        "name": "laptop-run",
        "searcher": {"name": "single", "metric": "unmanaged"},
        "workspace": "laptops",
        "project": "runs",
    }
    body = {"external_experiment_id": "e1", "external_trial_id": "t1", "config": config}
    opened = await api.ok("POST", "/api/v1/unmanaged/trials", token=api.admin, json=body)
    detail = await api.ok("GET", f"/api/v1/experiments/{opened['experiment_id']}", token=api.admin)
    assert (detail["workspace"], detail["project"]) == ("laptops", "runs")
    wrong = body | {"external_experiment_id": "e2", "config": config | {"project": "nope"}}
    status, answer = await api.call("POST", "/api/v1/unmanaged/trials", token=api.admin, json=wrong)
    assert status == 400 and answer["error"]["path"] == "project", answer
