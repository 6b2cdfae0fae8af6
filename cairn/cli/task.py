"""``cairn task``: every task the caller may see (an admin: everyone's), and a task's output.

``cairn task list`` shows commands and every later task kind in one table (Determined's
``det task list``); ``cairn task logs ID [-f]`` prints a task's output, and with ``-f`` keeps
printing it until the task ends.
"""

from __future__ import annotations

import argparse
from typing import Any

from cairn.cli import auth_store
from cairn.cli.command import add_workspace_filter, cmd_logs, list_tasks_of, stream_output
from cairn.cli.output import add_json_flag, print_json, table, wants_json, when


def register(sub: Any) -> None:
    """Adds the ``task`` verb group."""
    group = sub.add_parser("task", help="list tasks of every kind; read a task's output")
    group.set_defaults(group_parser=group, default_verb="list")
    verbs = group.add_subparsers(metavar="VERB")

    listing = verbs.add_parser(
        "list", aliases=["ls"], help="list the tasks you may see (admins: all)"
    )
    add_workspace_filter(listing)
    add_json_flag(listing)
    listing.set_defaults(handler=task_list)

    logs = verbs.add_parser("logs", help="print a task's output")
    logs.add_argument("task_id", metavar="ID")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing until the task ends"
    )
    add_json_flag(logs)
    logs.set_defaults(handler=task_logs)


def resource_pool_of(task: dict[str, Any]) -> str:
    """The pool a task asked for, as the queue names it (``default`` when it named none)."""
    resources = (task.get("config") or {}).get("resources") or {}
    return str(resources.get("resource_pool") or "default")


def task_list(args: argparse.Namespace) -> int:
    """Prints the tasks the caller may see, oldest first (``-w``: one workspace's; ``--json``:
    the API's answer)."""
    tasks = list_tasks_of(args)
    if wants_json(args):
        print_json({"tasks": tasks})
        return 0
    table(
        ["id", "type", "description", "state", "owner", "workspace", "resource pool", "submitted"],
        [
            [
                t["id"],
                t["kind"],
                t.get("description"),
                t["state"],
                t["owner"],
                t.get("workspace"),
                resource_pool_of(t),
                when(t.get("requested_at")),
            ]
            for t in tasks
        ],
    )
    return 0


def task_logs(args: argparse.Namespace) -> int:
    """Prints a task's output so far, or (``-f``) until it ended and every line was read."""
    if not args.follow or wants_json(args):
        return cmd_logs(args)
    client = auth_store.connect(args)
    client.get_task(args.task_id)  # 404/403 before any paging
    try:
        stream_output(client, args.task_id)
    except KeyboardInterrupt:
        return 130
    return 0
