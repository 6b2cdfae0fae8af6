"""``python -m services.api --db-file F --nats-file F --port P [--host H]``: the API gateway.

Checks its migrations, creates the initial admin user (password from
``CAIRN_ADMIN_PASSWORD_FILE``, or ``CAIRN_ADMIN_PASSWORD``; no default) and the agent token if
needed, serves HTTP, announces readiness and runs until SIGTERM/SIGINT. NATS is optional
(connected when a URL is given).
"""

from __future__ import annotations

import argparse
import os

import structlog
from aiohttp import web

from services import credentials
from services.api.app import create_app
from services.api.auth import cluster_secret
from services.runtime import ServiceContext, base_parser, main

log = structlog.get_logger("api")


async def run(ctx: ServiceContext) -> None:
    """Serves the gateway until stopped."""
    secret = await cluster_secret(ctx.store)
    admin_password = credentials.secret("CAIRN_ADMIN_PASSWORD")
    app = create_app(ctx.store, ctx.bus, secret=secret, admin_password=admin_password)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, ctx.args.host, ctx.args.port)
        await site.start()
        log.info("serving", host=ctx.args.host, port=ctx.args.port)
        ctx.ready()
        await ctx.stop.wait()
    finally:
        await runner.cleanup()


def parser() -> argparse.ArgumentParser:
    """The service flags plus ``--port`` and ``--host``."""
    p = base_parser("api")
    p.add_argument(
        "--port", type=int, default=int(os.environ.get("CAIRN_API_PORT", "8080")), help="HTTP port"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    return p


if __name__ == "__main__":
    main("api", run, parser=parser(), needs_bus=None)
