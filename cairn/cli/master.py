"""``cairn master info`` and ``cairn version``: what the master runs and what this client is."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import cairn
from cairn.cli import auth_store, verb_group
from cairn.cli.output import add_json_flag, fields, print_json, wants_json, when
from cairn.client import Client
from cairn.errors import EXIT_UNREACHABLE, UnreachableError


def register(sub: Any) -> None:
    """Adds the ``master`` verb group and the ``version`` verb."""
    group = sub.add_parser("master", help="the master's version, cluster id and uptime")
    verbs = verb_group(group)
    info = verbs.add_parser("info", help="show the master's version, cluster id and uptime")
    add_json_flag(info)
    info.set_defaults(handler=cmd_info)

    version = sub.add_parser("version", help="show the client's and the master's versions")
    add_json_flag(version)
    version.set_defaults(handler=cmd_version)


def uptime(seconds: float) -> str:
    """``2d 3h 4m 5s`` (leading zero units left out)."""
    rest = int(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append(f"{count}{unit}")
    parts.append(f"{rest}s")
    return " ".join(parts)


def _client(args: argparse.Namespace) -> Client:
    """A client without a token: the master's identity needs no login."""
    return Client(auth_store.resolve_master(getattr(args, "master", None)))


def cmd_info(args: argparse.Namespace) -> int:
    """Shows the master's version, cluster id, start time and uptime."""
    client = _client(args)
    info = client.master_info()
    if wants_json(args):
        print_json({"master": client.master, **info})
        return 0
    fields(
        [
            ("master", client.master),
            ("version", info.get("version")),
            ("cluster id", info.get("cluster_id")),
            ("started", when(info.get("started_at"))),
            ("uptime", uptime(float(info.get("uptime_seconds") or 0))),
        ]
    )
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    """Prints the client's version and the master's (exit 6 when the master does not answer)."""
    client = _client(args)
    try:
        master: dict[str, Any] | None = client.master_info()
        problem = None
    except UnreachableError as exc:
        master, problem = None, str(exc)
    if wants_json(args):
        print_json(
            {
                "client": {"version": cairn.__version__},
                "master": {"address": client.master, **master} if master else None,
            }
        )
    else:
        print(f"client: {cairn.__version__}")
        if master is not None:
            print(f"master: {master.get('version')} ({client.master})")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return 0
