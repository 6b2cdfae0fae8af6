"""``python -m services.scheduler``: a scheduler replica (only the lease holder decides)."""

from __future__ import annotations

import argparse

from events.consumer import ConsumerRunner
from events.lease import LeaderLease
from services.runtime import (
    ServiceContext,
    base_parser,
    main,
    run_until_stopped,
    until_lease_lost,
)
from services.scheduler.planner import Settings
from services.scheduler.service import SchedulerConsumer


async def run(ctx: ServiceContext) -> None:
    """Waits for the scheduler lease, rebuilds the cluster state, then schedules until stopped."""
    ctx.ready()
    lease = await LeaderLease.acquire(ctx.store, "scheduler", stop=ctx.stop)
    if lease is None:
        return
    settings = Settings(
        default_pool=ctx.args.default_pool,
        preemption=ctx.args.preemption,
        scheduler=ctx.args.policy,
    )
    consumer = SchedulerConsumer(ctx.store, settings, agent_timeout=ctx.args.agent_timeout)
    await consumer.rebuild()
    runner = ConsumerRunner(ctx.store, ctx.bus, consumer, catch_up_every=1.0, fence=lease.fence)
    try:
        await run_until_stopped(ctx, runner.run(ctx.stop), until_lease_lost(ctx, lease))
    finally:
        await lease.release()


def _parser() -> argparse.ArgumentParser:
    parser = base_parser("scheduler")
    parser.add_argument("--default-pool", default="default")
    parser.add_argument("--policy", choices=["priority", "fair_share"], default="priority")
    parser.add_argument("--preemption", action="store_true", default=True)
    parser.add_argument("--no-preemption", dest="preemption", action="store_false")
    parser.add_argument("--agent-timeout", type=float, default=15.0)
    return parser


if __name__ == "__main__":
    main("scheduler", run, parser=_parser())
