"""``cairn shell``: a terminal on the cluster, reached through the API's proxy.

``cairn shell start [--config-file F] [--config key=value ...] [--context DIR] [-w WORKSPACE]``
starts a shell task (in that workspace; the default one without ``-w``), waits until it serves, attaches this terminal to a new session and exits with the remote
shell's exit code (``-d``: print the id and return at once). The task keeps running after its
session ends, until it is killed or idle past its ``idle_timeout``: ``open ID`` attaches a new
session; ``list``, ``logs ID``, ``kill ID``; ``config`` prints the config it accepts. How the
terminal is bridged (raw mode, Ctrl-C, the window size, a piped stdin) is
:mod:`cairn.cli.shell_attach`'s.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.command import add_submission_flags, submit_task
from cairn.cli.output import add_json_flag
from cairn.cli.served import add_task_verbs, list_kind, task_to_open, wait_ready
from cairn.client import Client

CONFIG_TEMPLATE = """\
description: my shell         # shown by `cairn shell list`
resources:
  slots: 1                    # 0: a shell holding no slot
  priority: 42                # 1 is the most important
  resource_pool: ""           # "": the default pool
environment:
  environment_variables: []   # ["NAME=value", ...]
bind_mounts: []               # [{host_path: /datasets, container_path: /datasets, read_only: true}]:
                              #   in the task's container only, under the cluster's allowed roots
work_dir: null                # e.g. src: a directory of the context where sessions start
idle_timeout: null            # e.g. 30m: killed after that long without a session or any output
"""


def register(sub: Any) -> None:
    """Adds the ``shell`` verb group."""
    group = sub.add_parser("shell", help="interactive shells on the cluster")
    verbs = verb_group(group, default_verb="list")

    start = verbs.add_parser("start", help="start a shell, wait until it serves, attach to it")
    add_submission_flags(start, "shell", example="resources.slots=0")
    add_json_flag(start)
    start.set_defaults(handler=shell_start)

    add_task_verbs(
        verbs, "shell", "shell",
        list_handler=shell_list, open_handler=shell_open, config_handler=shell_config,
        open_help="attach this terminal to a new session of a shell", browser=False,
    )  # fmt: skip


def _attach(client: Client, task_id: str) -> int:
    from cairn.cli.shell_attach import attach

    code = attach(client.master, client.token, task_id)
    print(
        f"shell {task_id} keeps running: `cairn shell open {task_id}` attaches again, "
        f"`cairn shell kill {task_id}` stops it",
        file=sys.stderr,
    )
    return code


def shell_start(args: argparse.Namespace) -> int:
    """Starts a shell, waits until it serves and attaches to it; exits with the remote shell's
    exit code (``-d``: prints the id and returns)."""
    submitted = submit_task(
        args,
        lambda client, config: client.start_shell(config, args.context, workspace=args.workspace),
    )
    if submitted is None:
        return 0
    client, task_id = submitted
    print(f"launched shell {task_id}; waiting until it serves", file=sys.stderr)
    wait_ready(client, task_id, kind="shell")
    return _attach(client, task_id)


def shell_open(args: argparse.Namespace) -> int:
    """Attaches to a new session of a running shell (waiting until it serves); exits with the
    remote shell's exit code."""
    client = auth_store.connect(args)
    task_to_open(client, args.task_id, kind="shell")
    wait_ready(client, args.task_id, kind="shell")
    return _attach(client, args.task_id)


def shell_list(args: argparse.Namespace) -> int:
    """Lists the shells the caller may see (an admin's: everyone's)."""
    return list_kind(args, "shell")


def shell_config(args: argparse.Namespace) -> int:
    """Prints the shell config template (the fields ``--config-file`` accepts)."""
    print(CONFIG_TEMPLATE, end="")
    return 0
