"""``GET /api/v1/usage``: billed slot-seconds from the tracker's usage projection.

A non-admin sees only the usage of their own experiments and tasks; an admin sees everyone's
and may narrow it to one ``user``. Dates are UTC; ``to`` includes its whole day. By
``workspace``, a task counts for its own workspace and an experiment for its project's (as the
teams are now); by ``project``, tasks count as the default project's (``Uncategorized``).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates.teams import Teams
from events.log.errors import StatementError
from services.api.auth import principal_of
from services.api.errors import bad_request, forbidden, parse
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import current_teams
from services.tracker import read as tracker_read

routes = RouteTable("usage")

DEFAULT_DAYS = 30
"""The window when ``from`` is not given: this many days up to ``to``."""
MAX_DAYS = 3660
"""The longest window one request may ask for."""


class UsageQuery(BaseModel):
    """The window (UTC dates ``YYYY-MM-DD`` or ISO 8601 instants), grouping and format."""

    from_: str | None = Field(None, alias="from", max_length=40)
    to: str | None = Field(None, max_length=40)
    by: Literal["user", "pool", "experiment", "project", "workspace", "day"] = "user"
    format: Literal["json", "csv"] = "json"
    user: str | None = Field(None, max_length=200)


class UsageRow(BaseModel):
    """Slot-seconds of one group and slot type; the group's field is named after ``by``."""

    slot_type: str
    slot_ms: int
    slot_seconds: float
    user: str | None = None
    pool: str | None = None
    experiment: int | None = None
    project: int | None = None
    workspace: int | None = None
    name: str | None = Field(None, description="the project's or workspace's name")
    day: str | None = None


class UsageResponse(BaseModel):
    """The usage in ``[from, to)`` (instants, UTC), grouped by ``by`` and slot type."""

    by: str
    start: str
    end: str
    total_slot_ms: int
    total_slot_seconds: float
    rows: list[UsageRow]


def _instant(text: str, name: str, *, end: bool) -> datetime:
    """A date (its midnight; the next one for an ``end``) or an ISO instant (UTC if naive)."""
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=int(end))
        at = datetime.fromisoformat(text)
    except ValueError:
        raise bad_request(
            f"{name}: expected YYYY-MM-DD or an ISO 8601 time, got {text!r}", name
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def window(query: UsageQuery, now: datetime) -> tuple[datetime, datetime]:
    """The ``[start, end)`` instants a query asks for (default: the last 30 days to today)."""
    end = (
        _instant(query.to, "to", end=True)
        if query.to
        else _instant(now.date().isoformat(), "to", end=True)
    )
    start = (
        _instant(query.from_, "from", end=False)
        if query.from_
        else end - timedelta(days=DEFAULT_DAYS)
    )
    if end <= start:
        raise bad_request("from must be before to", "from")
    if end - start > timedelta(days=MAX_DAYS):
        raise bad_request(f"the window may span at most {MAX_DAYS} days", "from")
    return start, end


def project_workspaces(teams: Teams) -> dict[int, int]:
    """``{project_id: workspace_id}`` as the teams are now: what the tracker's usage report
    needs to sum experiments into workspaces (it does not read the teams stream)."""
    return {p.project_id: p.workspace_id for p in teams.projects.values()}


def placed(teams: Teams, rows: list[dict[str, Any]], by: str) -> list[dict[str, Any]]:
    """Rows by project or by workspace (``by``), named after the teams now; by project, a
    deleted project's usage counts as the default one's; a deleted workspace's row keeps its id
    as its name."""
    totals: dict[tuple[int, str], int] = defaultdict(int)
    for row in rows:
        key = int(row[by])
        if by == "project":
            key = teams.project_or_default(key).project_id
        totals[(key, str(row["slot_type"]))] += int(row["slot_ms"])
    out = []
    for (key, kind), ms in sorted(totals.items()):
        if by == "project":
            name = teams.projects[key].name
        else:
            workspace = teams.workspaces.get(key)
            name = workspace.name if workspace else str(key)
        out.append(
            {by: key, "name": name, "slot_type": kind, "slot_ms": ms, "slot_seconds": ms / 1000}
        )
    return out


@routes.get("/api/v1/usage", allow=USERS, query=UsageQuery, response=UsageResponse)
async def get_usage(request: web.Request) -> web.Response:
    """Slot-seconds per user, pool, experiment, project, workspace or day (and slot type) in a
    window, as JSON or CSV; a non-admin gets only their own usage."""
    query = parse(UsageQuery, dict(request.query))
    principal = principal_of(request)
    owner = query.user
    if not principal.is_admin:
        if owner is not None and owner != principal.name:
            raise forbidden("only an admin may see another user's usage")
        owner = principal.name
    now = datetime.now(UTC)
    start, end = window(query, now)
    start_ms, end_ms = tracker_read.epoch_ms(start), tracker_read.epoch_ms(end)
    placing = query.by in ("project", "workspace")
    teams = await current_teams(store_of(request)) if placing else None
    try:
        async with store_of(request).connection() as conn:
            rows = await tracker_read.usage_report(
                conn,
                start_ms,
                end_ms,
                query.by,
                owner=owner,
                now_ms=tracker_read.epoch_ms(now),
                workspaces=None if teams is None else project_workspaces(teams),
            )
    except StatementError as exc:
        if not exc.undefined_table:
            raise
        rows = []  # the tracker has not created its tables yet: nothing billed
    if teams is not None:
        rows = placed(teams, rows, query.by)
    if query.format == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(tracker_read.USAGE_CSV_COLUMNS[query.by])
        for row in rows:
            writer.writerow(
                [
                    row[query.by],
                    row["slot_type"],
                    tracker_read.slot_seconds_text(row["slot_ms"]),
                    row["slot_ms"],
                ]
            )
        return web.Response(text=out.getvalue(), content_type="text/csv")
    total = sum(int(row["slot_ms"]) for row in rows)
    return web.json_response(
        {
            "by": query.by,
            "start": start.isoformat(),
            "end": end.isoformat(),
            "total_slot_ms": total,
            "total_slot_seconds": total / 1000,
            "rows": rows,
        }
    )
