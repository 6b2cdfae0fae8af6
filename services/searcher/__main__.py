"""``python -m services.searcher``: a searcher replica (only the lease holder decides)."""

from __future__ import annotations

from events.consumer import ConsumerRunner
from events.lease import LeaderLease
from services.runtime import ServiceContext, main, run_until_stopped, until_lease_lost
from services.searcher.service import SearcherConsumer


async def run(ctx: ServiceContext) -> None:
    """Waits for the searcher lease, replays the searches, then searches until stopped."""
    ctx.ready()
    lease = await LeaderLease.acquire(ctx.store, "searcher", stop=ctx.stop)
    if lease is None:
        return
    consumer = SearcherConsumer(ctx.store)
    await consumer.rebuild()
    runner = ConsumerRunner(ctx.store, ctx.bus, consumer, catch_up_every=1.0, fence=lease.fence)
    try:
        await run_until_stopped(ctx, runner.run(ctx.stop), until_lease_lost(ctx, lease))
    finally:
        await lease.release()


if __name__ == "__main__":
    main("searcher", run)
