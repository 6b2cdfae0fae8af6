"""``python -m services.tracker``: the projections (``tr_*`` tables) and the checkpoint GC.

Flags besides the common ones (``--db-file``/``CAIRN_DB_FILE``, ``--nats-file``/``CAIRN_NATS_FILE``):
``--checkpoint-root`` (``CAIRN_CHECKPOINT_ROOT``; default ``$CAIRN_HOME/checkpoints`` or
``~/.cairn/checkpoints``), the root of experiments without ``checkpoint_storage``, and
``--rebuild``, which rebuilds the projections (usage included) from the log and exits. It also
sends webhook deliveries (:mod:`services.tracker.webhook_sender`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import structlog

from events import settings
from events.domain.config.storage import default_checkpoint_root
from services.runtime import ServiceContext, base_parser, main, run_until_stopped
from services.tracker import audit, gc, projections, schema, usage, webhooks
from services.tracker.projections import rebuild
from services.tracker.service import run_consumers
from services.tracker.usage import rebuild as rebuild_usage
from services.webhooks.addresses import cluster_endpoints

log = structlog.get_logger("tracker")


def parser() -> argparse.ArgumentParser:
    """The tracker's flags (environment variables in parentheses)."""
    p = base_parser("tracker")
    p.add_argument(
        "--checkpoint-root",
        type=Path,
        default=settings.CHECKPOINT_ROOT.get(),
        help="checkpoint storage of experiments without checkpoint_storage "
        "(CAIRN_CHECKPOINT_ROOT; default: $CAIRN_HOME/checkpoints or ~/.cairn/checkpoints)",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="truncate the projections, replay the log into them, and exit",
    )
    return p


async def run(ctx: ServiceContext) -> None:
    """Migrates, then projects, collects checkpoints and sends webhook deliveries until stopped
    (or rebuilds and exits; webhook deliveries are never rebuilt: they happened)."""
    await schema.migrate(ctx.store)
    await audit.migrate(ctx.store)
    await webhooks.migrate(ctx.store)
    if ctx.args.rebuild:
        applied = await rebuild(ctx.store)
        audited = await audit.rebuild(ctx.store)
        billed = await rebuild_usage(ctx.store)
        log.info("rebuild done", events=applied, audited=audited, usage_events=billed)
        return
    root = default_checkpoint_root(ctx.args.checkpoint_root)
    endpoints = await asyncio.to_thread(
        cluster_endpoints,
        db=ctx.args.db,
        nats=ctx.args.nats,
        api=[("0.0.0.0", settings.API_PORT.get())],
    )
    ctx.ready()
    log.info("tracking", checkpoint_root=str(root))
    consumers = run_consumers(
        ctx.store,
        ctx.bus,
        ctx.stop,
        checkpoint_root=root,
        storage_policy=ctx.cluster.checkpoint_storage,
        webhook_policy=ctx.cluster.webhooks,
        endpoints=endpoints,
    )
    await run_until_stopped(ctx, consumers)


if __name__ == "__main__":
    main(
        "tracker",
        run,
        parser=parser(),
        needs_bus="--rebuild" not in sys.argv[1:],
        consumers=(projections.NAME, gc.NAME, audit.NAME, usage.NAME, webhooks.NAME),
    )
