"""The audit trail: ``GET /api/v1/audit`` (admin), read from the tracker's ``audit_trail``.

Newest first, paged by position: a page's ``next_before`` is the ``before`` of the next page,
so rows appended meanwhile never shift a page. The trail may lag the log by a moment.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field, field_validator

from events.log.registry import known_types
from services.api.errors import parse
from services.api.routing import Access, RouteTable, store_of
from services.api.views import MAX_ID
from services.tracker import read as tracker_read

routes = RouteTable("audit")

ADMINS: frozenset[Access] = frozenset({"admin"})
MAX_LIMIT = 1000
MAX_POSITION = 2**62


class AuditQuery(BaseModel):
    """Filters of the trail; all optional and combined with AND."""

    model_config = {"extra": "forbid"}

    actor: str | None = Field(None, max_length=200, description="who acted (e.g. alice)")
    experiment_id: int | None = Field(None, ge=1, le=MAX_ID)
    type: str | None = Field(None, max_length=200, description="an event type")
    request_id: str | None = Field(None, max_length=64)
    since: datetime | None = Field(None, description="at or after this time (ISO 8601)")
    until: datetime | None = Field(None, description="before this time (ISO 8601)")
    before: int | None = Field(None, ge=1, le=MAX_POSITION, description="page cursor")
    limit: int = Field(100, ge=1, le=MAX_LIMIT)

    @field_validator("type")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in known_types():
            raise ValueError(f"unknown event type {value!r}")
        return value

    @field_validator("since", "until")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("must name a time zone (e.g. 2026-01-31T12:00:00Z)")
        return value


def row_of(record: tracker_read.AuditRow) -> dict[str, Any]:
    """An ``audit_trail`` row as the API shows it."""
    at: datetime = record["recorded_at"]
    detail = record["detail"]
    return {
        "position": int(record["position"]),
        "recorded_at": at.isoformat(),
        "type": str(record["type"]),
        "stream_id": str(record["stream_id"]),
        "actor": record["actor"],
        "request_id": record["request_id"],
        "remote": record["remote"],
        "experiment_id": record["experiment_id"],
        "trial_id": record["trial_id"],
        "detail": json.loads(detail) if isinstance(detail, str) else detail,
    }


class AuditEntry(BaseModel):
    """One event of the trail: what, when, by whom, from which request and address."""

    position: int
    recorded_at: str
    type: str
    stream_id: str
    actor: str | None
    request_id: str | None
    remote: str | None
    experiment_id: int | None
    trial_id: int | None
    detail: dict[str, Any] | None


class AuditResponse(BaseModel):
    """A page of the trail, newest first; ``next_before`` is null on the last page."""

    entries: list[AuditEntry]
    next_before: int | None


@routes.get("/api/v1/audit", allow=ADMINS, query=AuditQuery, response=AuditResponse)
async def get_audit(request: web.Request) -> web.Response:
    """The audit trail, newest first (admin; filters: actor, experiment, type, time range)."""
    query = parse(AuditQuery, dict(request.query))
    async with store_of(request).connection() as conn:
        rows = await tracker_read.audit_page(
            conn,
            actor=query.actor,
            experiment_id=query.experiment_id,
            type=query.type,
            request_id=query.request_id,
            since=query.since,
            until=query.until,
            before=query.before,
            limit=query.limit,
        )
    entries = [row_of(r) for r in rows]
    next_before = entries[-1]["position"] if len(entries) == query.limit else None
    return web.json_response({"entries": entries, "next_before": next_before})
