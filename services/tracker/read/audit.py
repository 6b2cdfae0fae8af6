"""The tracker's read of the audit trail."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypedDict, cast

from events.log.db import Connection
from services.tracker.read.sql import fetch_rows


class AuditRow(TypedDict):
    """One row of ``audit_trail``."""

    position: int
    recorded_at: datetime
    type: str
    stream_id: str
    actor: str | None
    request_id: str | None
    remote: str | None
    experiment_id: int | None
    trial_id: int | None
    detail: Any


async def audit_page(
    conn: Connection,
    *,
    actor: str | None,
    experiment_id: int | None,
    type: str | None,
    request_id: str | None,
    since: datetime | None,
    until: datetime | None,
    before: int | None,
    limit: int,
) -> list[AuditRow]:
    """Audit trail rows matching every filter given, newest first, positions below ``before``."""
    rows = await fetch_rows(
        conn,
        """SELECT position, recorded_at, type, stream_id, actor, request_id, remote,
                  experiment_id, trial_id, detail
           FROM audit_trail
           WHERE ($1::text IS NULL OR actor = $1)
             AND ($2::bigint IS NULL OR experiment_id = $2)
             AND ($3::text IS NULL OR type = $3)
             AND ($4::text IS NULL OR request_id = $4)
             AND ($5::timestamptz IS NULL OR recorded_at >= $5)
             AND ($6::timestamptz IS NULL OR recorded_at < $6)
             AND ($7::bigint IS NULL OR position < $7)
           ORDER BY position DESC LIMIT $8""",
        actor,
        experiment_id,
        type,
        request_id,
        since,
        until,
        before,
        limit,
    )
    return cast(list[AuditRow], rows)
