"""Readiness checks: the database answers, the bus is connected, a leader is caught up.

Each check returns ``"ok"`` or a sentence saying what is wrong; :func:`verdict` folds them into
the answer of ``/readyz`` (200 when all pass, else 503 naming the failing ones). A check never
waits longer than :data:`CHECK_TIMEOUT`: a database that hangs is as unready as one that refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import structlog

from events.log.bus import Bus
from events.log.errors import EventsError
from events.log.store import EventStore

CHECK_TIMEOUT = 2.0
"""Seconds a readiness check may take before it counts as failed."""
OK = "ok"
log = structlog.get_logger("observability")


async def database(store: EventStore) -> str:
    """Whether the database answers a query (the driver's error is logged, not returned: the
    answer may be shown to callers who should not learn the database's address)."""
    try:
        await asyncio.wait_for(store.fetchval("SELECT 1"), CHECK_TIMEOUT)
    except TimeoutError:
        return f"the database did not answer within {CHECK_TIMEOUT:g} s"
    except EventsError as exc:
        log.warning("readiness: database unreachable", error=str(exc))
        return "the database is unreachable"
    return OK


def bus(connection: Bus | None) -> str:
    """Whether the NATS connection is up (``None``: this process runs without a bus)."""
    if connection is None or connection.nc.is_connected:
        return OK
    return "NATS is disconnected (reconnecting)"


def caught_up(
    head: int, checkpoints: Mapping[str, int], consumers: tuple[str, ...], limit: int
) -> str:
    """Whether every one of ``consumers`` is at most ``limit`` events behind ``head``."""
    behind = {name: head - checkpoints.get(name, 0) for name in consumers}
    late = {name: lag for name, lag in behind.items() if lag > limit}
    if not late:
        return OK
    listed = ", ".join(f"{name} {lag}" for name, lag in sorted(late.items()))
    return f"consumers more than {limit} events behind the log: {listed}"


def verdict(checks: Mapping[str, str]) -> tuple[int, dict[str, object]]:
    """The status and JSON body of ``/readyz`` for these checks."""
    ready = all(result == OK for result in checks.values())
    return (200 if ready else 503), {"ready": ready, "checks": dict(checks)}
