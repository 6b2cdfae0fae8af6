"""``python -m services.relay``: run a relay replica (only the lease holder publishes)."""

from __future__ import annotations

from events.log.relay import CHECKPOINT, Relay
from services.runtime import ServiceContext, main, run_until_stopped


async def run(ctx: ServiceContext) -> None:
    """Relays while this replica holds the lease; ready once it leads or stands by."""
    assert ctx.bus is not None
    relay = Relay(ctx.store, ctx.bus)
    await run_until_stopped(
        ctx,
        relay.run(
            ctx.stop,
            on_leading=lambda: ctx.ready("leader"),
            on_standby=lambda: ctx.ready("standby"),
        ),
    )


if __name__ == "__main__":
    main("relay", run, decider=True, consumers=(CHECKPOINT,))
