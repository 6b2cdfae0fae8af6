"""``python -m services.searcher``: a searcher replica (only the lease holder decides)."""

from __future__ import annotations

import asyncio

from events.consumer import ConsumerRunner
from events.lease import LeaderLease
from services.runtime import ServiceContext, main, serve_replica
from services.searcher.service import SearcherConsumer


async def run(ctx: ServiceContext) -> None:
    """Follows the searches as a standby until it holds the searcher lease, then searches."""

    async def lead(consumer: SearcherConsumer, lease: LeaderLease, term: asyncio.Event) -> None:
        await consumer.advance()
        ctx.ready("leader")
        runner = ConsumerRunner(ctx.store, ctx.bus, consumer, catch_up_every=1.0, fence=lease.fence)
        await runner.run(term)

    await serve_replica(ctx, "searcher", lambda: SearcherConsumer(ctx.store), lead)


if __name__ == "__main__":
    main("searcher", run, decider=True)
