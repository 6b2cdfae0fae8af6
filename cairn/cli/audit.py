"""``cairn audit``: who did what, when and from where (admin)."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from cairn.cli import auth_store
from cairn.cli.output import add_json_flag, print_json, table, when
from cairn.errors import UsageError

_RELATIVE = re.compile(r"^([0-9]{1,6})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def register(sub: Any) -> None:
    """Adds the ``audit`` verb."""
    p = sub.add_parser("audit", help="show the audit trail, newest first (admin)")
    p.add_argument("--user", help="only what this actor did (a username, trial:N, agent)")
    p.add_argument("--experiment", type=int, help="only what concerns this experiment")
    p.add_argument("--type", help="only this event type (e.g. RequestRejected)")
    p.add_argument("--since", help="from this time: ISO 8601 (UTC if no zone) or 30m, 2h, 1d ago")
    p.add_argument("--until", help="before this time (same forms as --since)")
    p.add_argument("--limit", type=int, default=100, help="at most this many entries (100)")
    add_json_flag(p)
    p.set_defaults(handler=cmd_audit)


def parse_time(text: str, *, now: datetime | None = None) -> str:
    """An ISO 8601 time with a zone from ``2026-01-31``, ``2026-01-31T12:00`` or ``2h`` (ago).

    Raises:
        UsageError: ``text`` is none of those.
    """
    raw = text.strip()
    relative = _RELATIVE.match(raw)
    if relative:
        ago = timedelta(**{_UNITS[relative.group(2)]: int(relative.group(1))})
        return ((now or datetime.now(UTC)) - ago).isoformat()
    try:
        at = datetime.fromisoformat(raw)
    except ValueError:
        raise UsageError(
            f"not a time: {text!r} (use ISO 8601 like 2026-01-31T12:00Z, or 30m, 2h, 1d)"
        ) from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat()


def cmd_audit(args: argparse.Namespace) -> int:
    """Prints the audit trail with the given filters."""
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    client = auth_store.connect(args)
    query: dict[str, Any] = {
        "actor": args.user,
        "experiment_id": args.experiment,
        "type": args.type,
        "since": parse_time(args.since) if args.since else None,
        "until": parse_time(args.until) if args.until else None,
    }
    entries: list[dict[str, Any]] = []
    before: int | None = None
    while len(entries) < args.limit:
        page = client.get(
            "/audit", **query, before=before, limit=min(1000, args.limit - len(entries))
        )
        entries.extend(page["entries"])
        before = page.get("next_before")
        if before is None:
            break
    if getattr(args, "json", False):
        print_json({"entries": entries})
        return 0
    table(
        ["POSITION", "TIME", "ACTOR", "TYPE", "EXPERIMENT", "STREAM", "FROM", "DETAIL"],
        [
            [
                e["position"],
                when(e["recorded_at"]),
                e.get("actor") or "",
                e["type"],
                e.get("experiment_id") or "",
                e["stream_id"],
                e.get("remote") or "",
                _detail(e.get("detail")),
            ]
            for e in entries
        ],
    )
    return 0


def _detail(detail: dict[str, Any] | None) -> str:
    if not detail:
        return ""
    text = f"{detail.get('method', '')} {detail.get('path', '')} {detail.get('status', '')}"
    message = detail.get("message")
    suppressed = detail.get("suppressed")
    if message:
        text += f": {message}"
    if suppressed:
        text += f" (+{suppressed} not recorded)"
    return text.strip()
