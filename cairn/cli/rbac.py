"""``cairn rbac`` and ``cairn user-group``: roles and the groups they are granted to.

``rbac my-permissions|list-roles|describe-role|list-users-roles|assign-role|unassign-role`` and
``user-group list|create|describe|add-user|remove-user|change-name|delete``, with Determined's
names and flags (``-u``/``-g`` for who, ``-w`` for the workspace; none: cluster-wide).
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from cairn.cli import add_verb, auth_store, verb_group
from cairn.cli.output import confirmed, print_json, print_result, table, wants_json
from cairn.errors import UsageError


def register(sub: Any) -> None:
    """Adds the ``rbac`` and ``user-group`` verb groups."""
    group = sub.add_parser("rbac", help="roles: who may do what, where")
    verbs = verb_group(group, default_verb="list-roles")
    add_verb(
        verbs, "my-permissions", my_permissions, "what you may do, cluster-wide and per workspace"
    )
    add_verb(verbs, "list-roles", list_roles, "the built-in roles")
    add_verb(verbs, "describe-role", describe_role, "a role's permissions and holders", "role_name")
    add_verb(verbs, "list-users-roles", users_roles, "the roles a user holds", "username")
    for name, handler, text in (
        ("assign-role", assign_role, "grant a role to a user or group"),
        ("unassign-role", unassign_role, "withdraw a role from a user or group"),
    ):
        verb = add_verb(verbs, name, handler, text, "role_name")
        who = verb.add_mutually_exclusive_group(required=True)
        who.add_argument("-u", "--username-to-assign", dest="username")
        who.add_argument("-g", "--group-name-to-assign", dest="group_name")
        verb.add_argument("-w", "--workspace-name", dest="workspace", help="none: cluster-wide")

    group = sub.add_parser("user-group", help="groups of users (admins)")
    verbs = verb_group(group, default_verb="list")
    add_verb(verbs, "list", groups_list, "list groups", aliases=("ls",))
    create = add_verb(verbs, "create", group_create, "create a group", "group_name")
    create.add_argument("--add-user", action="append", default=[], metavar="USER")
    add_verb(verbs, "describe", group_describe, "a group's members", "group_name")
    add_verb(verbs, "add-user", group_add, "add users (USER1,USER2)", "group_name", "usernames")
    add_verb(
        verbs, "remove-user", group_remove, "remove users (USER1,USER2)", "group_name", "usernames"
    )
    add_verb(
        verbs, "change-name", group_rename, "rename a group", "old_group_name", "new_group_name"
    )
    delete = add_verb(verbs, "delete", group_delete, "delete a group", "group_name")
    delete.add_argument("--yes", action="store_true", help="do not ask")


def my_permissions(args: argparse.Namespace) -> int:
    """Prints what the caller may do."""
    data = auth_store.connect(args).get("/permissions/summary")
    if wants_json(args):
        print_json(data)
        return 0
    admin = " (admin)" if data.get("admin") else ""
    print(f"{data.get('username')}{admin}")
    print(f"cluster-wide: {', '.join(data.get('cluster') or []) or '-'}")
    for workspace, permissions in (data.get("workspaces") or {}).items():
        print(f"workspace {workspace}: {', '.join(permissions)}")
    return 0


def list_roles(args: argparse.Namespace) -> int:
    """Lists the built-in roles."""
    data = auth_store.connect(args).get("/roles")
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["ROLE", "SCOPE", "DESCRIPTION"],
        [[r["name"], "cluster" if r.get("cluster_only") else "cluster or workspace",
          r.get("description")] for r in data.get("roles") or []],
    )  # fmt: skip
    return 0


def _assignments(args: argparse.Namespace) -> list[dict[str, Any]]:
    data = auth_store.connect(args).get("/roles/assignments")
    return list(data.get("assignments") or [])


def _print_assignments(rows: list[dict[str, Any]]) -> None:
    table(
        ["ROLE", "USER", "GROUP", "WORKSPACE"],
        [[a.get("role"), a.get("username") or "-", a.get("group_name") or "-",
          a.get("workspace") or "(cluster)"] for a in rows],
    )  # fmt: skip


def describe_role(args: argparse.Namespace) -> int:
    """Prints a role's permissions and who holds it (what the caller may see of it)."""
    roles = {r["name"]: r for r in auth_store.connect(args).get("/roles").get("roles") or []}
    if args.role_name not in roles:
        raise UsageError(f"no role {args.role_name} (one of {', '.join(roles)})")
    holders = [a for a in _assignments(args) if a.get("role") == args.role_name]
    role = roles[args.role_name]
    if wants_json(args):
        print_json(role | {"assignments": holders})
        return 0
    print(f"{role['name']}: {role.get('description')}")
    print(f"permissions: {', '.join(role.get('permissions') or [])}")
    _print_assignments(holders)
    return 0


def users_roles(args: argparse.Namespace) -> int:
    """Prints the grants made to a user directly (those the caller may see)."""
    rows = [a for a in _assignments(args) if a.get("username") == args.username]
    if wants_json(args):
        print_json({"assignments": rows})
    else:
        _print_assignments(rows)
    return 0


def _role_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"role_name": args.role_name}
    if args.username:
        body["username"] = args.username
    else:
        body["group_name"] = args.group_name
    if args.workspace:
        body["workspace"] = args.workspace
    return body


def _where(args: argparse.Namespace) -> str:
    who = f"user {args.username}" if args.username else f"group {args.group_name}"
    return f"{who} {'in workspace ' + args.workspace if args.workspace else 'cluster-wide'}"


def assign_role(args: argparse.Namespace) -> int:
    """Grants a role."""
    done = auth_store.connect(args).post("/roles/add-assignments", _role_body(args))
    state = "granted to" if done.get("changed") else "already held by"
    return print_result(args, done, f"{args.role_name} {state} {_where(args)}")


def unassign_role(args: argparse.Namespace) -> int:
    """Withdraws a role."""
    done = auth_store.connect(args).post("/roles/remove-assignments", _role_body(args))
    state = "withdrawn from" if done.get("changed") else "was not held by"
    return print_result(args, done, f"{args.role_name} {state} {_where(args)}")


def _group_path(name: str) -> str:
    return f"/groups/{quote(name, safe='')}"


def groups_list(args: argparse.Namespace) -> int:
    """Lists groups."""
    data = auth_store.connect(args).get("/groups")
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["ID", "NAME", "MEMBERS"],
        [[g["id"], g["name"], ", ".join(g.get("members") or []) or "-"]
         for g in data.get("groups") or []],
    )  # fmt: skip
    return 0


def group_create(args: argparse.Namespace) -> int:
    """Creates a group."""
    users = [u for item in args.add_user for u in item.split(",") if u]
    made = auth_store.connect(args).post("/groups", {"name": args.group_name, "add_users": users})
    return print_result(args, made, f"group {made['name']} created (id {made['id']})")


def group_describe(args: argparse.Namespace) -> int:
    """Prints a group's members."""
    found = auth_store.connect(args).get(_group_path(args.group_name))
    if wants_json(args):
        print_json(found)
    else:
        print(f"{found['name']} (id {found['id']}): {', '.join(found.get('members') or []) or '-'}")
    return 0


def _patch(args: argparse.Namespace, name: str, changes: dict[str, Any]) -> Any:
    return auth_store.connect(args).call("PATCH", _group_path(name), changes)


def group_add(args: argparse.Namespace) -> int:
    """Adds users to a group."""
    users = [u for u in args.usernames.split(",") if u]
    done = _patch(args, args.group_name, {"add_users": users})
    return print_result(args, done, f"group {args.group_name}: {', '.join(done['members'])}")


def group_remove(args: argparse.Namespace) -> int:
    """Removes users from a group."""
    users = [u for u in args.usernames.split(",") if u]
    done = _patch(args, args.group_name, {"remove_users": users})
    return print_result(
        args, done, f"group {args.group_name}: {', '.join(done['members']) or 'no members'}"
    )


def group_rename(args: argparse.Namespace) -> int:
    """Renames a group."""
    done = _patch(args, args.old_group_name, {"name": args.new_group_name})
    return print_result(args, done, f"group {args.old_group_name} is now {done['name']}")


def group_delete(args: argparse.Namespace) -> int:
    """Deletes a group and its grants."""
    if not confirmed(args, f"delete group {args.group_name}?"):
        return 1
    done = auth_store.connect(args).call("DELETE", _group_path(args.group_name))
    return print_result(args, done, f"group {args.group_name} deleted")
