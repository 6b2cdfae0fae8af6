"""``python -m services.api --db-file F --nats-file F --port P [--host H]``: the API gateway.

Checks its migrations, creates the initial admin user (password from
``CAIRN_ADMIN_PASSWORD_FILE``, or ``CAIRN_ADMIN_PASSWORD``; no default) and the join token if
needed, serves HTTP, announces readiness and runs until SIGTERM/SIGINT. NATS is optional
(connected when a URL is given). ``--join-token-file`` names the cluster's join token and
``--nats-authority-file`` the bus's signing authority (both mode 0600; only the gateway reads the
latter), with which it gives each joining agent its own NATS user. ``--metrics-token-file``
names the bearer token a Prometheus scraper presents for ``/metrics`` (admins' tokens work too).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import structlog
from aiohttp import web

from events import settings
from events.log.bus_auth import Authority, read_private
from services import credentials
from services.api.app import create_app
from services.api.auth import cluster_secret
from services.runtime import ServiceContext, base_parser, main

log = structlog.get_logger("api")


async def run(ctx: ServiceContext) -> None:
    """Serves the gateway until stopped."""
    secret = await cluster_secret(ctx.store)
    authority = None
    if ctx.args.nats_authority_file:
        authority = Authority.from_json(
            read_private(Path(ctx.args.nats_authority_file), what="NATS authority")
        )
    app = create_app(
        ctx.store,
        ctx.bus,
        secret=secret,
        join_token_file=ctx.args.join_token_file,
        nats_authority=authority,
        cluster=ctx.cluster,
        admin_password=credentials.secret("CAIRN_ADMIN_PASSWORD"),
        metrics_token=(
            read_private(Path(ctx.args.metrics_token_file), what="metrics token").strip()
            if ctx.args.metrics_token_file
            else None
        ),
    )
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
        "--port", type=int, default=settings.API_PORT.get(), help="HTTP port (CAIRN_API_PORT)"
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address")
    p.add_argument(
        "--join-token-file",
        default=settings.JOIN_TOKEN_FILE.raw(),
        help="file with the cluster's join token (CAIRN_JOIN_TOKEN_FILE)",
    )
    p.add_argument(
        "--nats-authority-file",
        default=settings.NATS_AUTHORITY_FILE.raw(),
        help="the bus's signing authority, to issue agents NATS users (CAIRN_NATS_AUTHORITY_FILE)",
    )
    p.add_argument(
        "--metrics-token-file",
        default=settings.METRICS_TOKEN_FILE.raw(),
        help="file (mode 0600) with the bearer token a scraper presents for /metrics, "
        "besides an admin's (CAIRN_METRICS_TOKEN_FILE)",
    )
    return p


if __name__ == "__main__":
    main("api", run, parser=parser(), needs_bus=None)
