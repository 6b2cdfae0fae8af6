"""``python -m services.scheduler``: a scheduler replica (only the lease holder decides).

With Slurm pools in the cluster config (``resource_pools``), the leader also runs the Slurm
bridge (:mod:`services.scheduler.slurm.bridge`) under the same lease.
"""

from __future__ import annotations

import argparse
import asyncio

import structlog

from events.log.consumer import ConsumerRunner
from events.log.lease import LeaderLease
from services.runtime import (
    ServiceContext,
    base_parser,
    cluster_config_of,
    main,
    serve_replica,
)
from services.scheduler.planner import Settings
from services.scheduler.service import SchedulerConsumer
from services.scheduler.slurm.bridge import SlurmBridge
from services.scheduler.slurm.commands import SlurmCommands


async def run(ctx: ServiceContext) -> None:
    """Follows the cluster state as a standby until it holds the scheduler lease, then schedules."""
    settings = Settings(
        default_pool=ctx.args.default_pool,
        preemption=ctx.args.preemption,
        scheduler=ctx.args.policy,
        task_start_timeout=ctx.args.task_start_timeout,
    )
    slurm_pools = cluster_config_of(ctx.args, structlog.get_logger("scheduler")).slurm_pools()

    async def lead(consumer: SchedulerConsumer, lease: LeaderLease, term: asyncio.Event) -> None:
        await consumer.advance()
        runner = ConsumerRunner(ctx.store, ctx.bus, consumer, catch_up_every=1.0, fence=lease.fence)
        if not slurm_pools:
            ctx.ready("leader")
            await runner.run(term)
            return
        bridge = SlurmBridge(ctx.store, slurm_pools, settings.default_pool, SlurmCommands())
        await bridge.rebuild()
        polling = asyncio.ensure_future(bridge.poll(term))
        bridged = ConsumerRunner(ctx.store, ctx.bus, bridge, catch_up_every=1.0, fence=lease.fence)
        ctx.ready("leader")
        try:
            await asyncio.gather(runner.run(term), bridged.run(term))
        finally:
            polling.cancel()
            await asyncio.gather(polling, return_exceptions=True)

    def follow() -> SchedulerConsumer:
        return SchedulerConsumer(ctx.store, settings, agent_timeout=ctx.args.agent_timeout)

    await serve_replica(ctx, "scheduler", follow, lead)


def _parser() -> argparse.ArgumentParser:
    parser = base_parser("scheduler")
    parser.add_argument("--default-pool", default="default")
    parser.add_argument("--policy", choices=["priority", "fair_share"], default="priority")
    parser.add_argument("--preemption", action="store_true", default=True)
    parser.add_argument("--no-preemption", dest="preemption", action="store_false")
    parser.add_argument("--agent-timeout", type=float, default=15.0)
    parser.add_argument(
        "--task-start-timeout",
        type=float,
        default=Settings().task_start_timeout,
        help="seconds after a task's placement by which its agent must list it in its "
        "heartbeats; past them a task its agent never received is recorded lost",
    )
    return parser


if __name__ == "__main__":
    main(
        "scheduler",
        run,
        parser=_parser(),
        decider=True,
        consumers=(SchedulerConsumer.name,),
    )
