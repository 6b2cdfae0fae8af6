"""A consumer process for fault tests: applies every event once into the ``effects`` table."""

from __future__ import annotations

import asyncio
import signal
import sys

from events.bus import Bus
from events.consumer import ConsumerRunner
from events.store import EventStore
from tests.helpers import EFFECTS_DDL, EffectsConsumer


async def main(dsn: str, nats_url: str) -> None:
    store = await EventStore.connect(dsn)
    await store.pool.execute(EFFECTS_DDL)
    bus = await Bus.connect(nats_url)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    runner = ConsumerRunner(store, bus, EffectsConsumer(), catch_up_every=30.0)
    print("CONSUMER-READY", file=sys.stderr, flush=True)
    await runner.run(stop)
    await bus.close()
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
