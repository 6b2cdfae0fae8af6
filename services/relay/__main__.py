"""``python -m services.relay``: run a relay replica (only the lease holder publishes)."""

from __future__ import annotations

import asyncio

from events.relay import Relay
from services.runtime import ServiceContext, main, run_until_stopped


async def run(ctx: ServiceContext) -> None:
    """Relays until stopped; readiness is announced as soon as the replica is up (leader or not)."""
    assert ctx.bus is not None
    relay = Relay(ctx.store, ctx.bus)
    ctx.ready()
    await run_until_stopped(ctx, relay.run(ctx.stop, on_leading=asyncio.Event()))


if __name__ == "__main__":
    main("relay", run)
