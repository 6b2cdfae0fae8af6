"""``python -m services.searcher``: a searcher replica (only the lease holder decides)."""

from __future__ import annotations

import asyncio

from events.log.consumer import ConsumerRunner
from events.log.lease import LeaderLease
from services.runtime import ServiceContext, main, serve_replica
from services.searcher.custom_worker import CustomWorkers
from services.searcher.sandbox import SandboxSettings
from services.searcher.service import SearcherConsumer


async def run(ctx: ServiceContext) -> None:
    """Follows the searches as a standby until it holds the searcher lease, then searches."""

    settings = SandboxSettings.from_env()

    async def lead(consumer: SearcherConsumer, lease: LeaderLease, term: asyncio.Event) -> None:
        await consumer.advance()
        workers = CustomWorkers(ctx.store, fence=lease.fence, settings=settings)
        consumer.workers = workers
        ctx.ready("leader")
        runner = ConsumerRunner(ctx.store, ctx.bus, consumer, catch_up_every=1.0, fence=lease.fence)
        try:
            await runner.run(term)
        finally:
            consumer.workers = None
            await workers.close()

    await serve_replica(ctx, "searcher", lambda: SearcherConsumer(ctx.store), lead)


if __name__ == "__main__":
    main("searcher", run, decider=True, consumers=(SearcherConsumer.name,))
