"""Storing a batch of a run's output lines in ``task_logs`` (a trial's run or a task's)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from aiohttp import web

from services.api import tables
from services.api.routing import store_of
from services.contracts.agent import LogsBody


async def store_lines(
    request: web.Request,
    allocation_id: str,
    owner: Literal["trial_id", "task_id"],
    owner_id: int | str,
    body: LogsBody,
) -> web.Response:
    """Inserts ``body``'s lines in one statement, once per ``idempotency_key`` (a repeat
    inserts nothing), under the run's trial or task; NUL characters are dropped."""
    if not body.lines:
        return web.json_response({"inserted": 0})
    now = datetime.now(UTC)
    rows = await tables.fetch(
        store_of(request),
        f"""INSERT INTO task_logs
               (allocation_id, {owner}, idempotency_key, seq, ts, rank, stream, line)
           SELECT $1, $2, $3, u.seq, u.ts, u.rank, u.stream, u.line
           FROM unnest($4::int[], $5::timestamptz[], $6::int[], $7::text[], $8::text[])
                AS u(seq, ts, rank, stream, line)
           ON CONFLICT (allocation_id, idempotency_key, seq) DO NOTHING
           RETURNING 1""",
        allocation_id,
        owner_id,
        body.idempotency_key,
        list(range(len(body.lines))),
        [line.ts or now for line in body.lines],
        [line.rank for line in body.lines],
        [line.stream for line in body.lines],
        [line.line.replace("\x00", "") for line in body.lines],
    )
    return web.json_response({"inserted": len(rows)})
