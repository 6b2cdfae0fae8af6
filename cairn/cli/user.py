"""``cairn user``: login, logout, whoami, create, list, change-password, activate, deactivate,
link-with-agent-user, agent-user-group (alias ``u``)."""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from cairn.auth import env_password, login
from cairn.cli import auth_store, verb_group
from cairn.cli.output import add_json_flag, print_json, print_result, table, wants_json, when
from cairn.client import ApiError, Client
from cairn.errors import UsageError
from events import settings


def register(sub: Any) -> None:
    """Adds the ``user`` verb group."""
    group = sub.add_parser("user", aliases=["u"], help="log in and manage users")
    verbs = verb_group(group, default_verb="list")

    login = verbs.add_parser("login", help="log in and store the token for this master")
    login.add_argument(
        "username", nargs="?", help="default: -u, else env CAIRN_USER (DET_USER), else asked"
    )
    login.add_argument(
        "--password", help="default: env CAIRN_PASSWORD (DET_PASS), else asked on a terminal"
    )
    add_json_flag(login)
    login.set_defaults(handler=cmd_login)

    logout = verbs.add_parser("logout", help="revoke and forget the stored token")
    logout.add_argument(
        "-a", "--all", action="store_true", help="accepted for Determined's CLI (one token is kept)"
    )
    add_json_flag(logout)
    logout.set_defaults(handler=cmd_logout)

    whoami = verbs.add_parser("whoami", help="show who the stored token belongs to")
    add_json_flag(whoami)
    whoami.set_defaults(handler=cmd_whoami)

    create = verbs.add_parser("create", help="create a user (admin)")
    create.add_argument("username")
    create.add_argument("--admin", action="store_true", help="make the user an administrator")
    create.add_argument("--password", help="default: asked (twice) on a terminal")
    create.add_argument(
        "--remote", action="store_true", help=argparse.SUPPRESS
    )  # Determined's external identity provider: refused below
    add_json_flag(create)
    create.set_defaults(handler=cmd_create)

    ls = verbs.add_parser("list", aliases=["ls"], help="list users (admin)")
    ls.add_argument("-a", "--all", action="store_true", help="inactive users too (the default)")
    add_json_flag(ls)
    ls.set_defaults(handler=cmd_list)

    password = verbs.add_parser("change-password", help="change your password (admins: anyone's)")
    password.add_argument(
        "username", nargs="?", metavar="target_user", help="default: the logged-in user"
    )
    password.add_argument("--password", help="the new password (default: asked twice)")
    password.add_argument(
        "--old-password", help="your current password (default: asked; admins need none)"
    )
    add_json_flag(password)
    password.set_defaults(handler=cmd_change_password)

    for action, help_text in (
        ("activate", "let a deactivated user log in again (admin)"),
        ("deactivate", "stop a user from logging in and revoke their tokens (admin)"),
    ):
        p = verbs.add_parser(action, help=help_text)
        p.add_argument("username")
        add_json_flag(p)
        p.set_defaults(handler=cmd_set_active, active=action == "activate")

    link = verbs.add_parser(
        "link-with-agent-user",
        help="run a user's trials as a unix account of the agents' machines (admin)",
    )
    link.add_argument("username")
    link.add_argument("--agent-uid", type=int, required=True, help="the account's uid (not 0)")
    link.add_argument("--agent-gid", type=int, required=True, help="its group's gid (not 0)")
    link.add_argument("--agent-user", default="", help="the account's name (USER of trials)")
    link.add_argument("--agent-group", default="", help="the group's name")
    add_json_flag(link)
    link.set_defaults(handler=cmd_link_agent_user)

    shown = verbs.add_parser(
        "agent-user-group", help="show the unix identity a user's trials run as"
    )
    shown.add_argument("username", nargs="?", help="default: the logged-in user")
    add_json_flag(shown)
    shown.set_defaults(handler=cmd_agent_user_group)


def _ask(prompt: str) -> str:
    if not sys.stdin.isatty():
        raise UsageError(f"{prompt.rstrip(': ')} is required (no terminal to ask on)")
    return input(prompt)


def _password(given: str | None, *, confirm: bool = False) -> str:
    if given is not None:
        return given
    if not sys.stdin.isatty():
        raise UsageError(
            "a password is required: pass --password or set CAIRN_PASSWORD (or DET_PASS)"
        )
    password = getpass.getpass("Password: ")
    if confirm and getpass.getpass("Password (again): ") != password:
        raise UsageError("the passwords differ")
    return password


def cmd_login(args: argparse.Namespace) -> int:
    """Logs in with a username and password and stores the token for the master."""
    master = auth_store.resolve_master(args.master)
    username = (
        args.username
        or getattr(args, "as_user", None)
        or settings.USER.get()
        or settings.DET_USER.get()
        or _ask("Username: ")
    )
    password = _password(args.password or env_password(username))
    login(master, username, password)
    return print_result(
        args, {"master": master, "username": username}, f"logged in to {master} as {username}"
    )


def cmd_logout(args: argparse.Namespace) -> int:
    """Revokes the stored token on the master (if it answers) and forgets it."""
    master = auth_store.resolve_master(args.master)
    entry = auth_store.stored(master)
    if entry is None:
        return print_result(
            args, {"master": master, "logged_out": False}, f"not logged in to {master}"
        )
    try:
        Client(master, token=str(entry["token"])).logout()
    except ApiError as exc:
        if exc.status != 401:  # an already-revoked token is as good as logged out
            raise
    finally:
        auth_store.forget(master)
    return print_result(
        args,
        {"master": master, "logged_out": True, "username": entry.get("username")},
        f"logged out of {master} ({entry.get('username')})",
    )


def cmd_whoami(args: argparse.Namespace) -> int:
    """Shows the user the token belongs to."""
    client = auth_store.connect(args)
    me = client.me()
    if wants_json(args):
        print_json(me)
        return 0
    if me.get("kind") != "user":
        print(f"authenticated as {me.get('kind')} on {client.master}")
        return 0
    role = " (admin)" if me.get("admin") else ""
    print(f"logged in to {client.master} as {me.get('username')}{role}")
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    """Creates a user."""
    if args.remote:
        raise UsageError("--remote (an external identity provider) is not supported by cairn")
    password = _password(args.password, confirm=True)
    created = auth_store.connect(args).create_user(args.username, password, admin=args.admin)
    role = "admin " if created.get("admin") else ""
    return print_result(
        args, created, f"created {role}user {created.get('username', args.username)}"
    )


def cmd_list(args: argparse.Namespace) -> int:
    """Lists the users."""
    data = auth_store.connect(args).list_users()
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["USERNAME", "ADMIN", "ACTIVE", "CREATED"],
        [
            [u.get("username"), u.get("admin"), u.get("active", True), when(u.get("created_at"))]
            for u in data["users"]
        ],
    )
    return 0


def cmd_change_password(args: argparse.Namespace) -> int:
    """Changes a password; the logged-in user's own needs the current one unless an admin's."""
    client = auth_store.connect(args)
    me = client.me()
    if me.get("kind") != "user":
        raise UsageError("only a user token can change a password: run `cairn user login`")
    username = args.username or str(me.get("username"))
    own = username == me.get("username")
    old = args.old_password
    if own and not me.get("admin") and old is None:
        if not sys.stdin.isatty():
            raise UsageError("your current password is required: pass --old-password")
        old = getpass.getpass("Current password: ")
    new = _password(args.password, confirm=True)
    result = client.change_password(username, new, old_password=old if own else None)
    return print_result(
        args, result, f"password of {username} changed (their other sessions are logged out)"
    )


def cmd_set_active(args: argparse.Namespace) -> int:
    """Activates or deactivates a user."""
    result = auth_store.connect(args).set_user_active(args.username, args.active)
    state = "active" if result.get("active") else "deactivated"
    note = "" if result.get("changed") else " (unchanged)"
    return print_result(args, result, f"user {args.username}: {state}{note}")


def cmd_link_agent_user(args: argparse.Namespace) -> int:
    """Links a user to a unix account (their next runs use it)."""
    result = auth_store.connect(args).link_agent_user(
        args.username,
        args.agent_uid,
        args.agent_gid,
        user=args.agent_user,
        group=args.agent_group,
    )
    return print_result(
        args,
        result,
        f"trials of {args.username} run as uid {result.get('agent_uid')} "
        f"gid {result.get('agent_gid')} from their next start",
    )


def cmd_agent_user_group(args: argparse.Namespace) -> int:
    """Shows the unix identity a user's trials run as."""
    client = auth_store.connect(args)
    username = args.username or str(client.me().get("username"))
    result = client.agent_user_group(username)
    if wants_json(args):
        print_json(result)
    elif result.get("agent_uid") is None:
        print(f"{username}: no trial of theirs has run yet (an identity is assigned at the first)")
    else:
        how = "linked by an admin" if result.get("linked") else "assigned by the cluster"
        group = f" ({result['agent_group']})" if result.get("agent_group") else ""
        print(
            f"{username}: uid {result['agent_uid']} ({result.get('agent_user')}), "
            f"gid {result['agent_gid']}{group}, {how}"
        )
    return 0
