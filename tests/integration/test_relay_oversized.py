"""An event too large for the bus cannot wedge the relay: it goes out as a stub, and every later
event is still relayed and consumed."""

from __future__ import annotations

import asyncio
import json

from cairn.local.servers import ServerProcess
from events.domain.types import ExperimentSubmitted
from events.log.bus import (
    EVENTS_STREAM,
    POSITION_HEADER,
    STUB_HEADER,
    Bus,
    headers_size,
    subject_for,
)
from events.log.consumer import ConsumerRunner
from events.log.envelope import RecordedEvent
from events.log.limits import BUS_MAX_PAYLOAD, MAX_EVENT_BYTES
from events.log.relay import CHECKPOINT as RELAY_CHECKPOINT
from events.log.relay import Relay
from events.log.store import EventStore
from tests.helpers import EFFECTS_DDL, EffectsConsumer, effect_counts, wait_until

BIG = 2 * 1024 * 1024


def wire_size(event: RecordedEvent) -> int:
    """What publishing ``event`` whole would put on the wire (body and headers)."""
    headers = {"Nats-Msg-Id": str(event.event_id), POSITION_HEADER: str(event.position)}
    return len(event.model_dump_json().encode()) + headers_size(headers)


async def _at_least(store: EventStore, name: str, position: int) -> bool:
    return await store.checkpoint(name) >= position


async def test_event_over_max_payload_is_stubbed_and_later_events_flow(
    store: EventStore, nats_server: ServerProcess
) -> None:
    """A 2 MB event in the log (written under a raised store limit) is relayed as a stub and the
    events after it reach the bus and a bus-woken consumer, each applied exactly once."""
    await store.execute(EFFECTS_DDL)
    relay_bus = await Bus.connect(nats_server.url)
    consumer_bus = await Bus.connect(nats_server.url)
    # Only bus messages wake this consumer: its catch-up timer runs once, at start.
    runner = ConsumerRunner(store, consumer_bus, EffectsConsumer(), catch_up_every=3600.0)
    relay = Relay(store, relay_bus)
    stop = asyncio.Event()
    [first] = await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config={})])
    tasks = [asyncio.create_task(runner.run(stop))]
    legacy = await EventStore.connect(store.dsn, max_event_bytes=4 * BIG)
    try:
        await wait_until(lambda: _at_least(store, "effects", first.position))  # timer ran once
        [big] = await legacy.append(
            "experiment-2",
            [ExperimentSubmitted(experiment_id=2, config={"description": "x" * BIG})],
        )
        later = []
        for i in range(3, 6):
            later += await store.append(
                f"experiment-{i}", [ExperimentSubmitted(experiment_id=i, config={})]
            )
        # The fault: this event cannot be published whole on this server.
        assert relay_bus.max_payload == BUS_MAX_PAYLOAD
        assert wire_size(big) > relay_bus.max_payload > MAX_EVENT_BYTES
        tasks.append(asyncio.create_task(relay.run(stop)))

        head = await store.head()
        assert head == later[-1].position

        async def settled() -> bool:
            return (
                await store.checkpoint(RELAY_CHECKPOINT) >= head
                and await store.checkpoint("effects") >= head
            )

        await wait_until(settled, timeout=60)
        assert relay_bus.stubbed == 1
        counts = await effect_counts(store)
        assert sorted(counts) == [e.position for e in await store.read_all()]
        assert set(counts.values()) == {1}

        stub = await relay_bus.js.get_last_msg(EVENTS_STREAM, subject_for("experiment-2"))
        assert stub.headers is not None
        assert stub.headers[STUB_HEADER] == "too-large"
        assert stub.headers[POSITION_HEADER] == str(big.position)
        assert json.loads(stub.data or b"")["position"] == big.position
        whole = await relay_bus.js.get_last_msg(EVENTS_STREAM, subject_for(later[0].stream_id))
        assert whole.headers is not None and STUB_HEADER not in whole.headers
        assert json.loads(whole.data or b"")["event_id"] == str(later[0].event_id)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await legacy.close()
        await relay_bus.close()
        await consumer_bus.close()
