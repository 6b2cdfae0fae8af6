"""``cairn workspace`` (``w``) and ``cairn project`` (``p``): organise experiments.

``workspace list|create|describe|edit --name|archive|unarchive|delete|list-projects`` and
``project list WORKSPACE|create WORKSPACE NAME|describe|edit|archive|unarchive|delete|
list-experiments``, with Determined's names; a workspace or project is named by its name (or
its id). ``cairn experiment move ID WORKSPACE PROJECT`` moves an experiment between projects.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from cairn.cli import add_verb, auth_store, verb_group
from cairn.cli.output import confirmed, print_json, print_result, table, wants_json, when
from cairn.client import Client
from cairn.errors import UsageError


def register(sub: Any) -> None:
    """Adds the ``workspace`` and ``project`` verb groups."""
    group = sub.add_parser("workspace", aliases=["w"], help="workspaces of projects")
    verbs = verb_group(group, default_verb="list")
    add_verb(verbs, "list", ws_list, "list the workspaces you can see", aliases=("ls",))
    add_verb(verbs, "create", ws_create, "create a workspace", "name")
    add_verb(verbs, "describe", ws_describe, "describe a workspace", "workspace")
    edit = add_verb(verbs, "edit", ws_edit, "rename a workspace", "workspace")
    edit.add_argument("--name", required=True, help="its new name")
    add_verb(verbs, "archive", ws_archive, "archive a workspace", "workspace")
    add_verb(verbs, "unarchive", ws_unarchive, "unarchive a workspace", "workspace")
    delete = add_verb(verbs, "delete", ws_delete, "delete an empty workspace", "workspace")
    delete.add_argument("--yes", action="store_true", help="do not ask")
    add_verb(verbs, "list-projects", project_list, "list a workspace's projects", "workspace")

    group = sub.add_parser("project", aliases=["p"], help="projects of experiments")
    verbs = verb_group(group, default_verb="list")
    add_verb(
        verbs, "list", project_list, "list a workspace's projects", "workspace", aliases=("ls",)
    )
    create = add_verb(verbs, "create", project_create, "create a project", "workspace", "name")
    create.add_argument("--description", default="")
    add_verb(verbs, "describe", project_describe, "describe a project", "workspace", "project")
    edit = add_verb(
        verbs, "edit", project_edit, "rename or describe a project", "workspace", "project"
    )
    edit.add_argument("--new_name", "--new-name", dest="new_name", help="its new name")
    edit.add_argument("--description", help="its new description")
    add_verb(verbs, "archive", project_archive, "archive a project", "workspace", "project")
    add_verb(verbs, "unarchive", project_unarchive, "unarchive a project", "workspace", "project")
    delete = add_verb(
        verbs, "delete", project_delete, "delete an empty project", "workspace", "project"
    )
    delete.add_argument("--yes", action="store_true", help="do not ask")
    add_verb(
        verbs, "list-experiments", project_experiments, "list a project's experiments",
        "workspace", "project",
    )  # fmt: skip


def _ref(text: str) -> str:
    return quote(text, safe="")


def _project(client: Client, workspace: str, project: str) -> dict[str, Any]:
    """The project named ``project`` in workspace ``workspace``."""
    listed = client.get(f"/workspaces/{_ref(workspace)}/projects")
    for item in listed.get("projects") or []:
        if item.get("name") == project or str(item.get("id")) == project:
            return dict(item)
    raise UsageError(f"workspace {workspace} has no project {project}")


def _ws_line(w: dict[str, Any]) -> list[Any]:
    return [w.get("id"), w.get("name"), w.get("owner") or "-", w.get("num_projects"),
            "yes" if w.get("archived") else "", when(w.get("created_at"))]  # fmt: skip


def ws_list(args: argparse.Namespace) -> int:
    """Lists the workspaces the caller may see."""
    data = auth_store.connect(args).get("/workspaces")
    if wants_json(args):
        print_json(data)
        return 0
    rows = [_ws_line(w) for w in data.get("workspaces") or []]
    table(["ID", "NAME", "OWNER", "PROJECTS", "ARCHIVED", "CREATED"], rows)
    return 0


def ws_create(args: argparse.Namespace) -> int:
    """Creates a workspace."""
    made = auth_store.connect(args).post("/workspaces", {"name": args.name})
    return print_result(args, made, f"workspace {made.get('name')} created (id {made.get('id')})")


def ws_describe(args: argparse.Namespace) -> int:
    """Describes a workspace and lists its projects."""
    client = auth_store.connect(args)
    found = client.get(f"/workspaces/{_ref(args.workspace)}")
    projects = client.get(f"/workspaces/{_ref(args.workspace)}/projects")
    if wants_json(args):
        print_json(found | {"projects": projects.get("projects") or []})
        return 0
    table(["ID", "NAME", "OWNER", "PROJECTS", "ARCHIVED", "CREATED"], [_ws_line(found)])
    print()
    _print_projects(projects.get("projects") or [])
    return 0


def ws_edit(args: argparse.Namespace) -> int:
    """Renames a workspace."""
    done = auth_store.connect(args).call(
        "PATCH", f"/workspaces/{_ref(args.workspace)}", {"name": args.name}
    )
    return print_result(args, done, f"workspace {args.workspace} is now {done.get('name')}")


def ws_archive(args: argparse.Namespace) -> int:
    """Archives a workspace."""
    done = auth_store.connect(args).post(f"/workspaces/{_ref(args.workspace)}/archive")
    return print_result(args, done, f"workspace {args.workspace} archived")


def ws_unarchive(args: argparse.Namespace) -> int:
    """Unarchives a workspace."""
    done = auth_store.connect(args).post(f"/workspaces/{_ref(args.workspace)}/unarchive")
    return print_result(args, done, f"workspace {args.workspace} unarchived")


def ws_delete(args: argparse.Namespace) -> int:
    """Deletes an empty workspace."""
    if not confirmed(args, f"delete workspace {args.workspace}?"):
        return 1
    done = auth_store.connect(args).call("DELETE", f"/workspaces/{_ref(args.workspace)}")
    return print_result(args, done, f"workspace {args.workspace} deleted")


def _print_projects(projects: list[dict[str, Any]]) -> None:
    table(
        ["ID", "NAME", "DESCRIPTION", "OWNER", "ARCHIVED", "CREATED"],
        [
            [p.get("id"), p.get("name"), p.get("description") or "-", p.get("owner") or "-",
             "yes" if p.get("archived") else "", when(p.get("created_at"))]
            for p in projects
        ],
    )  # fmt: skip


def project_list(args: argparse.Namespace) -> int:
    """Lists a workspace's projects."""
    data = auth_store.connect(args).get(f"/workspaces/{_ref(args.workspace)}/projects")
    if wants_json(args):
        print_json(data)
    else:
        _print_projects(data.get("projects") or [])
    return 0


def project_create(args: argparse.Namespace) -> int:
    """Creates a project in a workspace."""
    made = auth_store.connect(args).post(
        f"/workspaces/{_ref(args.workspace)}/projects",
        {"name": args.name, "description": args.description},
    )
    return print_result(args, made, f"project {made.get('name')} created (id {made.get('id')})")


def project_describe(args: argparse.Namespace) -> int:
    """Describes a project."""
    found = _project(auth_store.connect(args), args.workspace, args.project)
    if wants_json(args):
        print_json(found)
    else:
        _print_projects([found])
    return 0


def project_edit(args: argparse.Namespace) -> int:
    """Renames a project or changes its description."""
    if args.new_name is None and args.description is None:
        raise UsageError("give --new_name or --description")
    client = auth_store.connect(args)
    found = _project(client, args.workspace, args.project)
    changes = {
        k: v
        for k, v in (("name", args.new_name), ("description", args.description))
        if v is not None
    }
    done = client.call("PATCH", f"/projects/{found['id']}", changes)
    return print_result(args, done, f"project {done.get('name')} changed")


def _project_action(args: argparse.Namespace, action: str) -> int:
    client = auth_store.connect(args)
    found = _project(client, args.workspace, args.project)
    done = client.post(f"/projects/{found['id']}/{action}")
    return print_result(args, done, f"project {args.project} {action}d")


def project_archive(args: argparse.Namespace) -> int:
    """Archives a project."""
    return _project_action(args, "archive")


def project_unarchive(args: argparse.Namespace) -> int:
    """Unarchives a project."""
    return _project_action(args, "unarchive")


def project_delete(args: argparse.Namespace) -> int:
    """Deletes a project that holds no experiment."""
    if not confirmed(args, f"delete project {args.project}?"):
        return 1
    client = auth_store.connect(args)
    found = _project(client, args.workspace, args.project)
    done = client.call("DELETE", f"/projects/{found['id']}")
    return print_result(args, done, f"project {args.project} deleted")


def project_experiments(args: argparse.Namespace) -> int:
    """Lists a project's experiments (those the caller may see)."""
    client = auth_store.connect(args)
    found = _project(client, args.workspace, args.project)
    data = client.get("/experiments", project_id=found["id"], archived="all")
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["ID", "NAME", "OWNER", "STATE", "SUBMITTED"],
        [[e.get("id"), e.get("name"), e.get("owner"), e.get("state"), when(e.get("submitted_at"))]
         for e in data.get("experiments") or []],
    )  # fmt: skip
    return 0


def experiment_move(args: argparse.Namespace) -> int:
    """Moves an experiment to project PROJECT of workspace WORKSPACE."""
    client = auth_store.connect(args)
    found = _project(client, args.workspace, args.project)
    done = client.post(f"/experiments/{args.id}/move", {"destination_project_id": found["id"]})
    line = (
        f"experiment {args.id} moved to {args.workspace}/{args.project}"
        if done.get("moved")
        else f"experiment {args.id} is in {args.workspace}/{args.project} already"
    )
    return print_result(args, done, line)
