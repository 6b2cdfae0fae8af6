"""The tracker's read of webhook deliveries: each webhook's delivery record, and the cluster's
webhook signing secret (which the gateway needs to sign a test delivery and to show a webhook's
key to those who may edit it)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TypedDict, cast

from events.log.db import Connection
from services.tracker.read.sql import fetch_rows


class DeliveryRecord(TypedDict):
    """How a webhook's deliveries went.

    Attributes:
        webhook_id: the webhook.
        delivered: deliveries its receiver answered 2xx.
        failed: deliveries given up.
        pending: deliveries queued or being retried.
        attempts: attempts made, all deliveries together.
        last_status: the HTTP status of the latest attempt (``None``: no answer, or none yet).
        last_error: what went wrong in the latest attempt ('' when it succeeded).
        last_attempt_at: when the latest attempt was made.
    """

    webhook_id: int
    delivered: int
    failed: int
    pending: int
    attempts: int
    last_status: int | None
    last_error: str
    last_attempt_at: datetime | None


async def delivery_records(
    conn: Connection, webhook_ids: Sequence[int]
) -> dict[int, DeliveryRecord]:
    """The delivery record of each of ``webhook_ids`` that has deliveries."""
    counts = await fetch_rows(
        conn,
        """SELECT webhook_id,
                  count(*) FILTER (WHERE state = 'delivered') AS delivered,
                  count(*) FILTER (WHERE state = 'failed') AS failed,
                  count(*) FILTER (WHERE state = 'pending') AS pending,
                  coalesce(sum(attempts), 0) AS attempts
           FROM webhook_deliveries WHERE webhook_id = ANY($1::bigint[])
           GROUP BY webhook_id""",
        list(webhook_ids),
    )
    latest = await fetch_rows(
        conn,
        """SELECT DISTINCT ON (webhook_id) webhook_id, last_status, last_error, last_attempt_at
           FROM webhook_deliveries
           WHERE webhook_id = ANY($1::bigint[]) AND last_attempt_at IS NOT NULL
           ORDER BY webhook_id, last_attempt_at DESC""",
        list(webhook_ids),
    )
    last = {int(r["webhook_id"]): r for r in latest}
    out: dict[int, DeliveryRecord] = {}
    for row in counts:
        webhook_id = int(row["webhook_id"])
        seen = last.get(webhook_id, {})
        out[webhook_id] = cast(
            DeliveryRecord,
            {
                "webhook_id": webhook_id,
                "delivered": int(row["delivered"]),
                "failed": int(row["failed"]),
                "pending": int(row["pending"]),
                "attempts": int(row["attempts"]),
                "last_status": seen.get("last_status"),
                "last_error": seen.get("last_error") or "",
                "last_attempt_at": seen.get("last_attempt_at"),
            },
        )
    return out


async def webhook_signing_secret(conn: Connection) -> bytes | None:
    """The cluster's webhook signing secret (``None`` while the tracker's tables do not exist)."""
    rows = await fetch_rows(conn, "SELECT value FROM webhook_secrets WHERE name = 'signing'")
    return bytes.fromhex(str(rows[0]["value"])) if rows else None
