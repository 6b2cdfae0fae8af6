"""A consumer process for fault tests: applies every event once into the ``effects`` table.

``python -m tests.fault.procs.effects_consumer DSN NATS_URL [ACK_WAIT [CATCH_UP_EVERY]]``
"""

from __future__ import annotations

import asyncio
import signal
import sys

from events.log.bus import ACK_WAIT_SECONDS, Bus
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
from tests.helpers import EFFECTS_DDL, EffectsConsumer


async def main(dsn: str, nats_url: str, ack_wait: float, catch_up_every: float) -> None:
    store = await EventStore.connect(dsn)
    await store.execute(EFFECTS_DDL)
    bus = await Bus.connect(nats_url)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    runner = ConsumerRunner(
        store, bus, EffectsConsumer(), catch_up_every=catch_up_every, ack_wait=ack_wait
    )
    print("CONSUMER-READY", file=sys.stderr, flush=True)
    await runner.run(stop)
    await bus.close()
    await store.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    asyncio.run(
        main(
            args[0],
            args[1],
            float(args[2]) if len(args) > 2 else ACK_WAIT_SECONDS,
            float(args[3]) if len(args) > 3 else 30.0,
        )
    )
