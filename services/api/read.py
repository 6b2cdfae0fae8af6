"""What other services may read of the gateway's tables (``tables.OWNED_TABLES``).

The gateway owns the telemetry agents and trials send it (heartbeats, progress) and the code
blobs users upload; these are not facts of the log, so services that need them (the scheduler
its agents' liveness, the searcher a custom search method's code) call these functions rather
than naming the tables. Every function takes a connection (the caller's transaction where it
needs one) and imports nothing of the web application.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from events.log.db import Connection

TABLES: tuple[str, ...] = ("agent_heartbeats", "trial_progress", "code_blobs")
"""The gateway's tables this module reads: all that a reading service's role may select from
them (:mod:`services.roles`); ``api_users``, ``api_tokens`` and ``api_secrets`` are never read
outside the gateway."""


@dataclass(frozen=True)
class Heartbeat:
    """An agent's latest heartbeat.

    Attributes:
        at: when it arrived, in seconds since the epoch (database clock).
        incarnation: which process of the agent sent the running list ('' before it said).
        seq: that process's heartbeat number (0: unnumbered).
        running: the allocations the agent said it runs.
    """

    at: float
    incarnation: str
    seq: int
    running: frozenset[str]


@dataclass(frozen=True)
class Heartbeats:
    """Every agent's latest heartbeat, read at one instant.

    Attributes:
        now: the database clock when they were read, in seconds since the epoch.
        agents: agent id -> its latest heartbeat.
    """

    now: float
    agents: dict[str, Heartbeat]


def _heartbeat(at: Any, row: dict[str, Any]) -> Heartbeat:
    running = row.get("running")
    return Heartbeat(
        at=float(at),
        incarnation=str(row.get("incarnation") or ""),
        seq=int(row.get("seq") or 0),
        running=frozenset(str(a) for a in running) if isinstance(running, list) else frozenset(),
    )


async def heartbeats(conn: Connection) -> Heartbeats | None:
    """Every agent's latest heartbeat, or ``None`` before the gateway created their table.

    Safe inside a transaction: a missing table is found out without a failing statement.
    """
    if not await conn.fetchval("SELECT to_regclass('agent_heartbeats') IS NOT NULL"):
        return None
    now = float(await conn.fetchval("SELECT extract(epoch FROM now())"))
    rows = await conn.fetch(
        # to_jsonb: a table the gateway has not yet migrated to add incarnation/seq still reads.
        "SELECT agent_id, extract(epoch FROM beat_at) AS t, to_jsonb(h)::text AS row"
        " FROM agent_heartbeats h"
    )
    return Heartbeats(
        now=now,
        agents={str(r["agent_id"]): _heartbeat(r["t"], orjson.loads(r["row"])) for r in rows},
    )


async def beat_times(conn: Connection, agent_ids: Sequence[str]) -> dict[str, datetime]:
    """When each of these agents last sent a heartbeat (agents that never did are absent)."""
    rows = await conn.fetch(
        "SELECT agent_id, beat_at FROM agent_heartbeats WHERE agent_id = ANY($1::text[])",
        list(agent_ids),
    )
    return {str(r["agent_id"]): r["beat_at"] for r in rows}


async def progress_of(conn: Connection, trial_ids: Sequence[int]) -> dict[int, float]:
    """The last progress each of these trials reported (trials that never did are absent)."""
    rows = await conn.fetch(
        "SELECT trial_id, progress FROM trial_progress WHERE trial_id = ANY($1::bigint[])",
        list(trial_ids),
    )
    return {int(r["trial_id"]): float(r["progress"]) for r in rows}


async def code_blob(conn: Connection, code_ref: str) -> bytes | None:
    """The uploaded code tarball ``code_ref`` names, or ``None`` if there is none."""
    data = await conn.fetchval("SELECT data FROM code_blobs WHERE code_ref = $1", code_ref)
    return bytes(data) if data is not None else None
