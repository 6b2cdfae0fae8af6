"""``cairn resource-pool`` (``rp``): which workspaces a resource pool serves.

``rp bindings list-workspaces POOL``, ``add POOL WS...``, ``remove POOL WS...`` and ``replace POOL
WS...`` (admins), Determined's verbs: a bound pool takes only its workspaces' experiments.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from cairn.cli import add_verb, auth_store, verb_group
from cairn.cli.output import print_json, print_result, wants_json


def register(sub: Any) -> None:
    """Adds the ``resource-pool`` verb group."""
    group = sub.add_parser("resource-pool", aliases=["rp"], help="resource pools' bindings")
    verbs = verb_group(group)
    bindings = verbs.add_parser("bindings", help="the workspaces a pool serves")
    verbs = verb_group(bindings, default_verb=None)
    add_verb(verbs, "list-workspaces", list_workspaces, "the workspaces a pool serves", "pool")
    for name, text in (
        ("add", "bind a pool to more workspaces"),
        ("remove", "unbind a pool from workspaces"),
        ("replace", "make a pool serve exactly these workspaces"),
    ):
        verb = add_verb(verbs, name, change, text, "pool")
        verb.add_argument("workspaces", nargs="*", metavar="WORKSPACE")
        verb.set_defaults(mode=name)


def _path(pool: str) -> str:
    return f"/resource-pools/{quote(pool, safe='')}/workspace-bindings"


def _line(data: dict[str, Any]) -> str:
    if not data.get("bound"):
        return f"pool {data['pool']} serves every workspace"
    return f"pool {data['pool']} serves {', '.join(data['workspaces'])}"


def list_workspaces(args: argparse.Namespace) -> int:
    """Prints the workspaces a pool serves."""
    data = auth_store.connect(args).get(_path(args.pool))
    if wants_json(args):
        print_json(data)
    else:
        print(_line(data))
    return 0


def change(args: argparse.Namespace) -> int:
    """Adds, removes or replaces a pool's workspaces."""
    method = {"add": "POST", "remove": "DELETE", "replace": "PUT"}[args.mode]
    done = auth_store.connect(args).call(
        method, _path(args.pool), {"workspace_names": list(args.workspaces)}
    )
    return print_result(args, done, _line(done))
