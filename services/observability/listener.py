"""The small HTTP listener of a process without a gateway: ``/metrics``, ``/healthz``, ``/readyz``.

Services other than the API, and agents, serve these on ``--metrics-address HOST:PORT``
(``CAIRN_METRICS_ADDRESS``; no listener by default). The listener takes no credentials: it is for
the cluster's internal network (bind it to loopback or to an interface only the scraper reaches;
see ``docs/security.md``). What it exposes holds no secret and no user's data: counts by pool,
state and consumer, and the process's own timings.

``/healthz`` answers 200 while the event loop runs (the process is alive); ``/readyz`` answers
200 when every readiness check passes and 503 naming those that do not; ``/metrics`` refreshes
what is read at scrape time, then answers Prometheus's text format.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import structlog
from aiohttp import web

from services.observability import health
from services.observability.process import CONTENT_TYPE

log = structlog.get_logger("observability")

Checks = Callable[[], Awaitable[Mapping[str, str]]]
"""Runs the readiness checks: name -> ``"ok"`` or what is wrong."""
Exposition = Callable[[], Awaitable[bytes]]
"""Refreshes the scrape-time gauges and returns the exposition."""


class ListenerError(Exception):
    """The metrics address cannot be served (the message names it and the flag)."""


def application(*, checks: Checks, exposition: Exposition) -> web.Application:
    """The listener's aiohttp application."""

    async def metrics(request: web.Request) -> web.Response:
        body = await exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        status, body = health.verdict(await checks())
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start(
    address: tuple[str, int], *, checks: Checks, exposition: Exposition
) -> web.AppRunner:
    """Serves the listener on ``address`` until the returned runner is cleaned up.

    Raises:
        ListenerError: the address cannot be bound (in use, or not this host's).
    """
    runner = web.AppRunner(application(checks=checks, exposition=exposition), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, address[0], address[1]).start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenerError(
            f"cannot serve metrics on {address[0]}:{address[1]} (--metrics-address, "
            f"CAIRN_METRICS_ADDRESS): {exc.strerror or exc}"
        ) from exc
    log.info("serving metrics", host=address[0], port=address[1])
    return runner
