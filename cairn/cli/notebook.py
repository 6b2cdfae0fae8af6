"""``cairn notebook``: JupyterLab on the cluster, reached through the API's proxy.

``cairn notebook start [--config-file F] [--config key=value ...] [--context DIR] [-w WORKSPACE]``
starts one (in that workspace; the default one without ``-w``) and waits until it serves (``-d``: print the id and return); ``open ID`` prints its URL and opens
a browser where there is one (a browser logged in to the web UI carries the session cookie the
proxy accepts); ``list [-w WORKSPACE]``, ``logs ID``, ``kill ID``; ``config`` prints the config
it accepts.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.command import add_submission_flags, submit_task
from cairn.cli.output import add_json_flag, wants_json
from cairn.cli.served import (
    add_task_verbs,
    list_kind,
    proxy_url,
    show_url,
    task_to_open,
    wait_ready,
)
from cairn.client import Client

CONFIG_TEMPLATE = """\
description: my notebook      # shown by `cairn notebook list`
resources:
  slots: 1                    # 0: a CPU notebook holding no slot
  priority: 42                # 1 is the most important
  resource_pool: ""           # "": the default pool
environment:
  environment_variables: []   # ["NAME=value", ...]
bind_mounts: []               # [{host_path: /datasets, container_path: /datasets, read_only: true}]:
                              #   in the task's container only, under the cluster's allowed roots
work_dir: null                # e.g. src: a directory of the context to start in
                              #   (the file browser's root stays the context)
idle_timeout: null            # e.g. 30m: killed after that long without kernel activity
"""


def register(sub: Any) -> None:
    """Adds the ``notebook`` verb group."""
    group = sub.add_parser("notebook", help="JupyterLab notebooks on the cluster")
    verbs = verb_group(group, default_verb="list")

    start = verbs.add_parser("start", help="start a notebook and wait until it serves")
    add_submission_flags(start, "notebook", example="idle_timeout=30m")
    start.add_argument("--no-browser", action="store_true", help="do not open a browser")
    add_json_flag(start)
    start.set_defaults(handler=notebook_start)

    add_task_verbs(
        verbs, "notebook", "notebook",
        list_handler=notebook_list, open_handler=notebook_open, config_handler=notebook_config,
        open_help="print a notebook's URL and open a browser",
    )  # fmt: skip


def notebook_url(client: Client, task: dict[str, Any]) -> str:
    """The notebook's address through the API's proxy."""
    return proxy_url(client, task, "lab")


def _show(args: argparse.Namespace, client: Client, task: dict[str, Any]) -> None:
    show_url(args, task, notebook_url(client, task))


def notebook_start(args: argparse.Namespace) -> int:
    """Starts a notebook; waits until it serves and shows its URL (``-d``: prints the id)."""
    submitted = submit_task(
        args,
        lambda client, config: client.start_notebook(
            config, args.context, workspace=args.workspace
        ),
    )
    if submitted is None:
        return 0
    client, task_id = submitted
    if not wants_json(args):
        print(f"launched notebook {task_id}; waiting until it serves", file=sys.stderr)
    _show(args, client, wait_ready(client, task_id, kind="notebook"))
    return 0


def notebook_list(args: argparse.Namespace) -> int:
    """Lists the notebooks the caller may see (an admin's: everyone's)."""
    return list_kind(args, "notebook")


def notebook_open(args: argparse.Namespace) -> int:
    """Prints a notebook's URL and opens it in a browser (``--no-browser``: only prints)."""
    client = auth_store.connect(args)
    _show(args, client, task_to_open(client, args.task_id, kind="notebook"))
    return 0


def notebook_config(args: argparse.Namespace) -> int:
    """Prints the notebook config template (the fields ``--config-file`` accepts)."""
    print(CONFIG_TEMPLATE, end="")
    return 0
