"""``cairn cmd`` (alias ``command``): run a command on the cluster, list, describe, kill, logs,
print the config template.

``cairn cmd run [--config-file F] [--config key=value ...] [--context DIR] [-w WORKSPACE] CMD...``
submits a command task (in that workspace; the default one without ``-w``), prints its output as
it is shipped, and exits with the command's exit code (as Determined's ``det cmd run``). Ctrl-C detaches: the command keeps running
(``cairn cmd kill ID`` stops it). A command that never ran (canceled, lost) exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.output import add_json_flag, fields, print_json, table, wants_json, when
from cairn.client import Client
from cairn.errors import UsageError

POLL_SECONDS = 0.5
NO_EXIT_CODE = 1
"""What ``cmd run`` exits with when the command ended without an exit code of its own."""

CONFIG_TEMPLATE = """\
description: prepare data     # shown by `cairn cmd list` (default: the command line)
resources:
  slots: 1                    # 0: a command holding no slot
  priority: 42                # 1 is the most important
  resource_pool: ""           # "": the default pool
environment:
  environment_variables: []   # ["NAME=value", ...]
bind_mounts: []               # [{host_path: /datasets, container_path: /datasets, read_only: true}]:
                              #   in the task's container only, under the cluster's allowed roots
work_dir: null                # e.g. scripts: a directory of the context the command runs in
"""


def register(sub: Any) -> None:
    """Adds the ``cmd`` verb group."""
    group = sub.add_parser("cmd", aliases=["command"], help="run commands on the cluster")
    verbs = verb_group(group, default_verb="list")

    run = verbs.add_parser("run", help="run a command; print its output; exit with its code")
    add_submission_flags(run, "command", example="resources.slots=0")
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="CMD", help="command to run")
    add_json_flag(run)
    run.set_defaults(handler=cmd_run)

    listing = verbs.add_parser("list", aliases=["ls"], help="list the commands you may see")
    add_workspace_filter(listing)
    add_json_flag(listing)
    listing.set_defaults(handler=cmd_list)

    config = verbs.add_parser("config", help="print the command config template")
    config.set_defaults(handler=cmd_config)

    for name, handler, text in (
        ("describe", cmd_describe, "show a command"),
        ("logs", cmd_logs, "print a command's output"),
        ("kill", cmd_kill, "kill a command"),
    ):
        verb = verbs.add_parser(name, help=text)
        verb.add_argument("task_id", metavar="ID")
        add_json_flag(verb)
        verb.set_defaults(handler=handler)


def add_workspace_filter(parser: Any) -> None:
    """``-w/--workspace NAME`` on a list verb: only that workspace's tasks."""
    parser.add_argument(
        "-w", "--workspace", metavar="NAME", help="only this workspace's tasks (its name or id)"
    )


def add_submission_flags(parser: Any, kind: str, *, example: str) -> None:
    """The flags every task submission takes: ``--config-file``, ``--config KEY=VALUE``,
    ``--context DIR``, ``--workspace NAME`` and ``--detach``.

    Args:
        parser: the verb's parser.
        kind: the task's kind as the help names it (``command``, ``notebook``, ``shell``).
        example: a ``--config`` example for the help.
    """
    parser.add_argument("--config-file", type=Path, metavar="FILE", help=f"{kind} config YAML")
    parser.add_argument(
        "--config",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"set a config field by dotted path, e.g. {example} (repeatable)",
    )
    parser.add_argument(
        "-c", "--context", type=Path, metavar="DIR", help="directory to upload as the work dir"
    )
    add_workspace_flag(parser, kind)
    parser.add_argument(
        "-d", "--detach", action="store_true", help="print the task id and return at once"
    )


def add_workspace_flag(parser: Any, kind: str) -> None:
    """``-w/--workspace NAME`` on a submission: the workspace the task goes in."""
    parser.add_argument(
        "-w",
        "--workspace",
        metavar="NAME",
        help=f"the workspace the {kind} goes in (its name or id; default: Uncategorized)",
    )


def list_tasks_of(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The tasks the caller may see, of ``--workspace`` when given."""
    answer = auth_store.connect(args).list_tasks(workspace=getattr(args, "workspace", None))
    return list(answer.get("tasks") or [])


def load_task_config(path: Path | None, overrides: list[str]) -> dict[str, Any]:
    """The config file (if any) with ``key.path=value`` overrides applied; the API validates it.

    Raises:
        UsageError: the file cannot be read, is not a YAML mapping, or an override is malformed.
    """
    from events.domain.config import ConfigError, apply_overrides, load_yaml

    doc: Any = {}
    if path is not None:
        try:
            doc = load_yaml(path.read_text(encoding="utf-8"), source=str(path))
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        except ConfigError as exc:
            problems = "; ".join(f"{where}: {message}" for where, message in exc.errors)
            raise UsageError(f"invalid config {path}: {problems}") from None
        if doc is None:
            doc = {}
        if not isinstance(doc, dict):
            raise UsageError(f"{path}: a command config must be a mapping")
    try:
        return apply_overrides(doc, overrides)
    except ConfigError as exc:
        problems = "; ".join(f"{where}: {message}" for where, message in exc.errors)
        raise UsageError(f"invalid --config: {problems}") from None


def _print_lines(page: dict[str, Any]) -> None:
    for entry in page.get("logs") or []:
        out = sys.stderr if entry.get("stream") == "stderr" else sys.stdout
        print(entry.get("line", ""), file=out, flush=True)


def stream_output(client: Client, task_id: str, *, show: bool = True) -> dict[str, Any]:
    """Prints the task's output until it ended and every line was read; returns the task."""
    after = 0
    while True:
        page = client.task_logs(task_id, after_id=after)
        if show:
            _print_lines(page)
        after = int(page.get("next_after_id") or after)
        if page.get("done"):
            return client.get_task(task_id)
        if not page.get("logs"):
            time.sleep(POLL_SECONDS)


def submit_task(
    args: argparse.Namespace, submit: Callable[[Client, dict[str, Any]], dict[str, Any]]
) -> tuple[Client, str] | None:
    """Checks ``--context``, loads the config (file and overrides) and submits the task with
    ``submit(client, config)``; returns the client and the task's id, or ``None`` once a
    ``--detach`` submission is printed (its id, or its JSON under ``--json``)."""
    if args.context is not None and not args.context.is_dir():
        raise UsageError(f"--context {args.context}: not a directory")
    config = load_task_config(args.config_file, args.overrides)
    client = auth_store.connect(args)
    task = submit(client, config)
    task_id = str(task["id"])
    if not args.detach:
        return client, task_id
    if wants_json(args):
        print_json(task)
    else:
        print(task_id)
    return None


def exit_code_of(task: dict[str, Any]) -> int:
    """The command's exit code (:data:`NO_EXIT_CODE` when it has none)."""
    code = task.get("exit_code")
    return int(code) if code is not None else NO_EXIT_CODE


def cmd_run(args: argparse.Namespace) -> int:
    """Submits the command and follows it; exits with its exit code."""
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("give the command to run, e.g. cairn cmd run python prep.py")
    submitted = submit_task(
        args,
        lambda client, config: client.run_command(
            argv, config, args.context, workspace=args.workspace
        ),
    )
    if submitted is None:
        return 0
    client, task_id = submitted
    if not wants_json(args):
        print(f"launched command {task_id}", file=sys.stderr, flush=True)
    try:
        final = stream_output(client, task_id, show=not wants_json(args))
    except KeyboardInterrupt:
        print(
            f"\ndetached; command {task_id} keeps running (cairn cmd kill {task_id} stops it)",
            file=sys.stderr,
        )
        return 130
    message = final.get("message") or ""
    if wants_json(args):
        print_json(final)
    elif final.get("outcome") != "completed" and (final.get("outcome") != "failed" or message):
        print(f"command {task_id} {final.get('outcome')}: {message}", file=sys.stderr)
    return exit_code_of(final)


def cmd_config(args: argparse.Namespace) -> int:
    """Prints the command config template (the fields ``--config-file`` accepts)."""
    print(CONFIG_TEMPLATE, end="")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """Lists the tasks the caller may see (an admin's: everyone's; ``-w``: one workspace's)."""
    tasks = list_tasks_of(args)
    if wants_json(args):
        print_json({"tasks": tasks})
        return 0
    table(
        ["id", "owner", "workspace", "state", "exit", "description", "submitted"],
        [
            [
                t["id"],
                t["owner"],
                t.get("workspace"),
                t["state"],
                t.get("exit_code"),
                t.get("description"),
                when(t.get("requested_at")),
            ]
            for t in tasks
        ],
    )
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    """Shows one command."""
    task = auth_store.connect(args).get_task(args.task_id)
    if wants_json(args):
        print_json(task)
        return 0
    fields(
        [
            ("id", task["id"]),
            ("kind", task["kind"]),
            ("owner", task["owner"]),
            ("workspace", task.get("workspace")),
            ("state", task["state"]),
            ("command", " ".join(task.get("argv") or [])),
            ("description", task.get("description")),
            ("agent", task.get("agent_id")),
            ("outcome", task.get("outcome")),
            ("exit code", task.get("exit_code")),
            ("message", task.get("message")),
            ("submitted", when(task.get("requested_at"))),
            ("started", when(task.get("started_at"))),
            ("ended", when(task.get("ended_at"))),
        ]
    )
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Prints a command's output so far (``--json``: the lines as the API gives them)."""
    client = auth_store.connect(args)
    client.get_task(args.task_id)  # 404/403 before any paging
    after = 0
    lines: list[dict[str, Any]] = []
    while True:
        page = client.task_logs(args.task_id, after_id=after)
        if wants_json(args):
            lines.extend(page.get("logs") or [])
        else:
            _print_lines(page)
        after = int(page.get("next_after_id") or after)
        if not page.get("logs"):
            break
    if wants_json(args):
        print_json({"logs": lines})
    return 0


def cmd_kill(args: argparse.Namespace) -> int:
    """Kills a command (cancels it if it has not started)."""
    result = auth_store.connect(args).kill_task(args.task_id)
    if wants_json(args):
        print_json(result)
    else:
        already = "" if result.get("changed", True) else " (unchanged)"
        kind = getattr(args, "task_kind", "command")
        print(f"{kind} {args.task_id}: kill requested in state {result.get('state')}{already}")
    return 0
