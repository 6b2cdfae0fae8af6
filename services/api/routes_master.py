"""The master's identity: its version, the cluster's id and how long this gateway has run."""

from __future__ import annotations

import importlib.metadata
import time
import uuid
from datetime import UTC, datetime

from aiohttp import web
from pydantic import BaseModel

from events.log.store import EventStore
from services.api.routing import PUBLIC, RouteTable, store_of

routes = RouteTable("master")

STARTED = web.AppKey("cairn_started", tuple[float, datetime])
"""When the gateway started: a monotonic clock reading and the wall-clock time."""


class MasterInfo(BaseModel):
    """What ``cairn master info`` shows."""

    version: str
    cluster_id: str
    started_at: str
    uptime_seconds: float


def version() -> str:
    """The installed cairn version (``unknown`` when it is not installed as a package)."""
    try:
        return importlib.metadata.version("cairn")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def mark_started(app: web.Application) -> None:
    """Records now as the gateway's start."""
    app[STARTED] = (time.monotonic(), datetime.now(UTC))


async def cluster_id(store: EventStore) -> str:
    """The cluster's id: a random UUID chosen on first use and kept in ``api_secrets`` (it is no
    secret, but lives with the cluster's other identity values)."""
    await store.execute(
        "INSERT INTO api_secrets (name, value) VALUES ('cluster_id', $1) "
        "ON CONFLICT (name) DO NOTHING",
        str(uuid.uuid4()),
    )
    value = await store.fetchval("SELECT value FROM api_secrets WHERE name = 'cluster_id'")
    return str(value)


@routes.get("/api/v1/master", allow=PUBLIC, response=MasterInfo)
async def get_master(request: web.Request) -> web.Response:
    """The master's version, the cluster's id and this gateway's uptime (no login needed)."""
    monotonic, wall = request.app[STARTED]
    return web.json_response(
        {
            "version": version(),
            "cluster_id": await cluster_id(store_of(request)),
            "started_at": wall.isoformat(),
            "uptime_seconds": round(time.monotonic() - monotonic, 3),
        }
    )
