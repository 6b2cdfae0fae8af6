"""``cairn tensorboard``: TensorBoard over experiments' and trials' TensorBoard files, reached
through the API's proxy.

``cairn tensorboard start EXP_ID... [-t TRIAL_ID ...] [--config-file F] [--config key=value]
[-w WORKSPACE]`` starts one (in that workspace; the default one without ``-w``) over every trial
of the experiments and the named trials, waits until it serves and
prints its URL (opening a browser where there is one; ``-d``: print the id and return);
``list``, ``open ID``, ``logs ID``, ``kill ID``; ``config`` prints the config it accepts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.command import add_workspace_flag, submit_task
from cairn.cli.output import add_json_flag, print_json, table, wants_json, when
from cairn.cli.served import add_task_verbs, proxy_url, show_url, tasks_of_kind, wait_ready
from cairn.client import Client
from cairn.errors import UsageError

KIND = "tensorboard"

CONFIG_TEMPLATE = """\
description: my TensorBoard   # shown by `cairn tensorboard list`
resources:
  slots: 0                    # a TensorBoard holds no slot unless you ask for one
  priority: 42                # 1 is the most important
  resource_pool: ""           # "": the default pool
environment:
  environment_variables: []   # ["NAME=value", ...]
bind_mounts: []               # [{host_path: /datasets, container_path: /datasets, read_only: true}]:
                              #   in the task's container only, under the cluster's allowed roots
                              # (work_dir: none; a TensorBoard has no context)
"""


def register(sub: Any) -> None:
    """Adds the ``tensorboard`` verb group."""
    group = sub.add_parser("tensorboard", help="TensorBoard over experiments and trials")
    verbs = verb_group(group, default_verb="list")

    start = verbs.add_parser("start", help="start a TensorBoard and wait until it serves")
    start.add_argument(
        "experiment_ids", type=int, nargs="*", metavar="EXP_ID", help="every trial of these"
    )
    start.add_argument(
        "-t",
        "--trial-ids",
        type=int,
        nargs="+",
        action="extend",
        default=[],
        metavar="TRIAL_ID",
        help="these trials (of any of your experiments)",
    )
    start.add_argument("--config-file", type=Path, metavar="FILE", help="TensorBoard config YAML")
    start.add_argument(
        "--config",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config field by dotted path, e.g. resources.slots=1 (repeatable)",
    )
    add_workspace_flag(start, "TensorBoard")
    start.add_argument(
        "-d", "--detach", action="store_true", help="print the task id and return at once"
    )
    start.add_argument("--no-browser", action="store_true", help="do not open a browser")
    add_json_flag(start)
    start.set_defaults(handler=tensorboard_start, context=None)

    add_task_verbs(
        verbs, KIND, "TensorBoard",
        list_handler=tensorboard_list, open_handler=tensorboard_open,
        config_handler=tensorboard_config,
        open_help="print a TensorBoard's URL and open a browser",
    )  # fmt: skip


def tensorboard_url(client: Client, task: dict[str, Any]) -> str:
    """The TensorBoard's address through the API's proxy."""
    return proxy_url(client, task)


def _show(args: argparse.Namespace, client: Client, task: dict[str, Any]) -> None:
    show_url(args, task, tensorboard_url(client, task))


def _shown(task: dict[str, Any]) -> str:
    return ", ".join(
        f"exp {s['experiment_id']}"
        + ("" if s.get("trial_ids") is None else f" trials {','.join(map(str, s['trial_ids']))}")
        for s in task.get("tensorboard_sources") or []
    )


def tensorboard_start(args: argparse.Namespace) -> int:
    """Starts a TensorBoard; waits until it serves and shows its URL (``-d``: prints the id)."""
    if not args.experiment_ids and not args.trial_ids:
        raise UsageError("name experiments (EXP_ID...) or trials (-t TRIAL_ID...) to show")
    submitted = submit_task(
        args,
        lambda client, config: client.start_tensorboard(
            args.experiment_ids, args.trial_ids, config, workspace=args.workspace
        ),
    )
    if submitted is None:
        return 0
    client, task_id = submitted
    if not wants_json(args):
        print(f"launched TensorBoard {task_id}; waiting until it serves", file=sys.stderr)
    _show(args, client, wait_ready(client, task_id, kind=KIND))
    return 0


def tensorboard_list(args: argparse.Namespace) -> int:
    """Lists the TensorBoards the caller may see (an admin's: everyone's; ``-w``: one
    workspace's)."""
    tasks = tasks_of_kind(args, KIND)
    if wants_json(args):
        print_json({"tasks": tasks})
        return 0
    table(
        ["id", "owner", "workspace", "state", "ready", "shows", "submitted"],
        [
            [
                t["id"],
                t["owner"],
                t.get("workspace"),
                t["state"],
                "yes" if t.get("ready") else "",
                _shown(t),
                when(t.get("requested_at")),
            ]
            for t in tasks
        ],
    )
    return 0


def tensorboard_open(args: argparse.Namespace) -> int:
    """Prints a TensorBoard's URL and opens it in a browser (``--no-browser``: only prints)."""
    client = auth_store.connect(args)
    task = client.get_task(args.task_id)
    if task.get("kind") != KIND:
        raise UsageError(f"task {args.task_id} is a {task.get('kind')}, not a TensorBoard")
    if task.get("state") == "TERMINATED":
        raise UsageError(f"TensorBoard {args.task_id} has ended ({task.get('outcome')})")
    _show(args, client, task)
    return 0


def tensorboard_config(args: argparse.Namespace) -> int:
    """Prints the TensorBoard config template (the fields ``--config-file`` accepts)."""
    print(CONFIG_TEMPLATE, end="")
    return 0
