"""What ``cairn notebook``, ``cairn shell`` and ``cairn tensorboard`` share: their common verbs,
waiting until a served task is ready, finding one to open, and listing the tasks of one kind."""

from __future__ import annotations

import argparse
import time
import webbrowser
from typing import Any

from cairn.cli.output import print_json, table, wants_json, when
from cairn.client import Client
from cairn.errors import UsageError

POLL_SECONDS = 0.5
START_TIMEOUT = 600.0
"""How long ``start`` waits for the task to serve (it may queue for a slot)."""


def add_task_verbs(
    verbs: Any,
    kind: str,
    label: str,
    *,
    list_handler: Any,
    open_handler: Any,
    config_handler: Any,
    open_help: str,
    browser: bool = True,
) -> None:
    """Adds the verbs every served task kind has: ``list``/``ls``, ``open ID``, ``logs ID``,
    ``kill ID`` and ``config`` (``label``: the kind as help texts name it, e.g. ``notebook``;
    ``browser``: ``open`` takes ``--no-browser`` and ``--json``)."""
    from cairn.cli.command import add_workspace_filter, cmd_kill, cmd_logs
    from cairn.cli.output import add_json_flag

    listing = verbs.add_parser("list", aliases=["ls"], help=f"list the {label}s you may see")
    add_workspace_filter(listing)
    add_json_flag(listing)
    listing.set_defaults(handler=list_handler)

    opening = verbs.add_parser("open", help=open_help)
    opening.add_argument("task_id", metavar="ID")
    if browser:
        opening.add_argument("--no-browser", action="store_true", help="only print the URL")
        add_json_flag(opening)
    opening.set_defaults(handler=open_handler)

    for name, handler, text in (
        ("logs", cmd_logs, f"print a {label}'s output"),
        ("kill", cmd_kill, f"kill a {label}"),
    ):
        verb = verbs.add_parser(name, help=text)
        verb.add_argument("task_id", metavar="ID")
        add_json_flag(verb)
        verb.set_defaults(handler=handler, task_kind=kind)

    config = verbs.add_parser("config", help=f"print the {label} config template")
    config.set_defaults(handler=config_handler)


def proxy_url(client: Client, task: dict[str, Any], page: str = "") -> str:
    """A served task's address through the API's proxy (``page``: a path under it)."""
    return f"{client.master}{task.get('proxy_path') or '/proxy/' + str(task['id']) + '/'}{page}"


def show_url(args: argparse.Namespace, task: dict[str, Any], url: str) -> None:
    """Prints a served task's ``url`` (with the task, under ``--json``) and opens a browser on
    it unless ``--no-browser``."""
    if wants_json(args):
        print_json({**task, "url": url})
        return
    print(url)
    if not args.no_browser:
        webbrowser.open(url)


def wait_ready(
    client: Client, task_id: str, *, kind: str, timeout: float = START_TIMEOUT
) -> dict[str, Any]:
    """Polls the task until it serves or ends; returns it.

    Raises:
        UsageError: it ended before serving, or did not serve within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        task = client.get_task(task_id)
        if task.get("ready"):
            return task
        if task.get("state") == "TERMINATED":
            raise UsageError(
                f"{kind} {task_id} ended before serving ({task.get('outcome')}: "
                f"{task.get('message')}); `cairn {kind} logs {task_id}` shows why"
            )
        if time.monotonic() > deadline:
            raise UsageError(f"{kind} {task_id} is still {task.get('state')} after {timeout:g}s")
        time.sleep(POLL_SECONDS)


def task_to_open(client: Client, task_id: str, *, kind: str) -> dict[str, Any]:
    """The task ``task_id``, if it is a ``kind`` that has not ended.

    Raises:
        UsageError: it is of another kind, or it ended.
    """
    task = client.get_task(task_id)
    if task.get("kind") != kind:
        raise UsageError(f"task {task_id} is a {task.get('kind')}, not a {kind}")
    if task.get("state") == "TERMINATED":
        raise UsageError(f"{kind} {task_id} has ended ({task.get('outcome')})")
    return task


def tasks_of_kind(args: argparse.Namespace, kind: str) -> list[dict[str, Any]]:
    """The tasks of ``kind`` the caller may see (of ``--workspace`` when given)."""
    from cairn.cli.command import list_tasks_of

    return [t for t in list_tasks_of(args) if t["kind"] == kind]


def list_kind(args: argparse.Namespace, kind: str) -> int:
    """Prints the tasks of ``kind`` the caller may see (an admin's: everyone's; ``-w``: one
    workspace's; ``--json``: as the API gives them)."""
    tasks = tasks_of_kind(args, kind)
    if wants_json(args):
        print_json({"tasks": tasks})
        return 0
    table(
        ["id", "owner", "workspace", "state", "ready", "description", "submitted"],
        [
            [
                t["id"],
                t["owner"],
                t.get("workspace"),
                t["state"],
                "yes" if t.get("ready") else "",
                t.get("description"),
                when(t.get("requested_at")),
            ]
            for t in tasks
        ],
    )
    return 0
