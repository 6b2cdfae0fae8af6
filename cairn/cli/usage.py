"""``cairn usage``: billed slot-seconds per user, pool, experiment, project, workspace or day
(UTC dates); by project or workspace the rows show their names (a task counts for its own
workspace)."""

from __future__ import annotations

import argparse
import sys
import urllib.parse
from typing import Any

from cairn.cli import auth_store
from cairn.cli.output import add_json_flag, print_json, table, wants_json


def register(sub: Any) -> None:
    """Adds the ``usage`` verb."""
    p = sub.add_parser(
        "usage", help="slot-seconds used, per user, pool, experiment, project, workspace or day"
    )
    p.add_argument("--from", dest="start", metavar="D", help="first day, YYYY-MM-DD (UTC)")
    p.add_argument("--to", dest="end", metavar="D", help="last day, included (default: today)")
    p.add_argument(
        "--by",
        choices=("user", "pool", "experiment", "project", "workspace", "day"),
        default="user",
        help="group by (default: %(default)s); rows are split by slot type too",
    )
    p.add_argument("--user", help="only this user's usage (admins; others see only their own)")
    p.add_argument("--csv", action="store_true", help="print CSV as the API returns it")
    add_json_flag(p)
    p.set_defaults(handler=cmd_usage)


def _query(args: argparse.Namespace, fmt: str) -> dict[str, str]:
    query = {"by": args.by, "format": fmt}
    for key, value in (("from", args.start), ("to", args.end), ("user", args.user)):
        if value:
            query[key] = value
    return query


def cmd_usage(args: argparse.Namespace) -> int:
    """Prints the usage table (or CSV, or JSON)."""
    client = auth_store.connect(args)
    if args.csv:
        path = "/usage?" + urllib.parse.urlencode(_query(args, "csv"))
        sys.stdout.write(client.download(path).decode())
        return 0
    data = client.get("/usage", **_query(args, "json"))
    if wants_json(args):
        print_json(data)
        return 0
    rows = [
        [r.get("name") or r.get(args.by), r.get("slot_type"), _seconds(r.get("slot_ms", 0))]
        for r in data["rows"]
    ]
    table([args.by.upper(), "SLOT TYPE", "SLOT-SECONDS"], rows)
    print(
        f"total {_seconds(int(data['total_slot_ms']))} slot-seconds, {data['start']} .. {data['end']}"
    )
    return 0


def _seconds(ms: int) -> str:
    whole, frac = divmod(int(ms), 1000)
    return f"{whole}.{frac:03d}"
