"""Processes SIGKILLed at named fault points; the log and every consumer stay exact."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

import nats
from nats.js.errors import NotFoundError

from cairn.local.servers import ServerProcess
from events.domain.types import ExperimentSubmitted
from events.log.bus import EVENTS_STREAM, Bus, connect_options, position_of
from events.log.consumer import ConsumerRunner
from events.log.relay import CHECKPOINT as RELAY_CHECKPOINT
from events.log.store import EventStore, lease_stream
from tests.helpers import (
    EFFECTS_DDL,
    EffectsConsumer,
    effect_counts,
    spawn,
    wait_for_line,
    wait_until,
)

ACK_WAIT = 2.0  # seconds; the production default is events.log.bus.ACK_WAIT_SECONDS
CHECKPOINT_ROW = "SELECT true FROM checkpoints WHERE name = $1"


async def jetstream_count(url: str) -> int:
    nc = await nats.connect(**connect_options(url))
    try:
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
        return int(info.state.messages)
    finally:
        await nc.close()


async def append_some(store: EventStore, start: int, n: int) -> None:
    for i in range(start, start + n):
        await store.append(f"experiment-{i}", [ExperimentSubmitted(experiment_id=i, config={})])


async def test_writer_killed_mid_transaction_leaves_no_partial_batch(
    store: EventStore, db_url: str, service_env: Callable[..., dict[str, str]]
) -> None:
    """SIGKILL between INSERT and COMMIT: none of the batch is visible and the next append works."""
    env = service_env("store.before_commit=120")
    proc = spawn("tests.fault.procs.append_writer", db_url, "trial-91", "500", env=env)
    await asyncio.to_thread(wait_for_line, proc, "FAULT-POINT store.before_commit")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert await store.read_stream("trial-91") == []
    await asyncio.wait_for(append_some(store, 1, 1), 15)  # the table lock was released
    events = await store.read_all()
    assert [e.stream_id for e in events] == ["experiment-1"]
    assert events[0].position > 1, "the killed batch burned positions; the gap is harmless"


async def test_relay_killed_between_publish_and_checkpoint_republishes(
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    service_env: Callable[..., dict[str, str]],
) -> None:
    """A relay killed after publishing but before checkpointing republishes; consumers apply once."""
    await store.execute(EFFECTS_DDL)
    await append_some(store, 1, 20)
    env = service_env("relay.after_publish=120")
    relay = spawn("services.relay", "--db", db_url, "--nats", nats_server.url, env=env)
    await asyncio.to_thread(wait_for_line, relay, "FAULT-POINT relay.after_publish")
    relay.send_signal(signal.SIGKILL)
    relay.wait(10)
    assert await store.checkpoint(RELAY_CHECKPOINT) == 0
    logged = len(await store.read_all())  # 20 plus the relay's LeaderElected
    assert await jetstream_count(nats_server.url) == logged

    bus = await Bus.connect(nats_server.url)
    runner = ConsumerRunner(store, bus, EffectsConsumer(), catch_up_every=60.0)
    stop = asyncio.Event()
    consuming = asyncio.create_task(runner.run(stop))
    relay = spawn("services.relay", "--db", db_url, "--nats", nats_server.url, env=service_env())
    try:
        # The new relay is elected (its LeaderElected is logged), then everything is relayed;
        # a wake-up reads to the head, so effects can get there before the last publish.
        await wait_until(lambda: _elected(store, 2))
        await append_some(store, 21, 5)
        await wait_until(lambda: _settled(store))
        logged = len(await store.read_all())
        assert await jetstream_count(nats_server.url) == logged, "republish deduplicated by id"
        counts = await effect_counts(store)
        assert len(counts) == logged and set(counts.values()) == {1}
    finally:
        relay.send_signal(signal.SIGTERM)
        relay.wait(10)
        stop.set()
        await consuming
        await bus.close()


async def test_consumer_killed_after_commit_before_ack_skips_redelivery(
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    service_env: Callable[..., dict[str, str]],
) -> None:
    """Messages whose effects committed before a SIGKILL, unacked, are redelivered to the
    restarted consumer, which acks them without applying anything twice."""
    await store.execute(EFFECTS_DDL)
    # Only bus wake-ups apply events in the killed process (its timer catch-up runs once, on the
    # empty log); a short ack wait makes JetStream redeliver its unacked messages within the test.
    consumer = spawn(
        "tests.fault.procs.effects_consumer",
        db_url,
        nats_server.url,
        str(ACK_WAIT),
        "3600",
        env=service_env("consumer.after_commit=120"),
    )
    relay: subprocess.Popen[str] | None = None
    bus: RecordingBus | None = None
    stop = asyncio.Event()
    consuming: asyncio.Task[None] | None = None
    try:
        await asyncio.to_thread(wait_for_line, consumer, "CONSUMER-READY")
        await wait_until(lambda: durable_exists(nats_server.url, "effects"))
        await wait_until(lambda: store.fetchval(CHECKPOINT_ROW, "effects"))
        await append_some(store, 1, 10)
        relay = spawn(
            "services.relay", "--db", db_url, "--nats", nats_server.url, env=service_env()
        )
        await asyncio.to_thread(wait_for_line, consumer, "FAULT-POINT consumer.after_commit")
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(10)
        committed = await store.checkpoint("effects")
        applied = await effect_counts(store)
        assert committed > 0 and set(applied.values()) == {1}
        unacked = await ack_pending(nats_server.url, "effects")
        assert unacked > 0, "the kill left delivered messages unacked"

        bus = await RecordingBus.connect(nats_server.url)
        runner = ConsumerRunner(
            store, bus, EffectsConsumer(), catch_up_every=3600.0, ack_wait=ACK_WAIT
        )
        consuming = asyncio.create_task(runner.run(stop))
        await append_some(store, 11, 5)
        head = await store.head()
        await wait_until(lambda: _at(store, "effects", head), timeout=40)
        # Every message the kill left unacked comes back (delivery count 2) and is acked again;
        # some carry events whose effects the killed process had committed.
        await wait_until(lambda: len(bus.redelivered()) >= unacked, timeout=40)
        assert min(bus.redelivered()) <= committed
        await wait_until(lambda: _no_ack_pending(nats_server.url), timeout=40)
        counts = await effect_counts(store)
        assert sorted(counts) == [e.position for e in await store.read_all()]
        assert set(counts.values()) == {1}, f"applied twice: {counts}"
    finally:
        stop.set()
        if consuming is not None:
            await consuming
        if bus is not None:
            await bus.close()
        for proc in (relay, consumer):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(10)


class RecordingBus(Bus):
    """A real bus connection that notes each fetched message's position and delivery count."""

    def __init__(self, nc: Any, js: Any) -> None:
        super().__init__(nc, js)
        self.deliveries: list[tuple[int, int]] = []

    async def pull(self, durable: str, subjects: Sequence[str], **kwargs: Any) -> Any:
        sub = await super().pull(durable, subjects, **kwargs)
        fetch = sub.fetch

        async def recording_fetch(*args: Any, **kw: Any) -> Any:
            msgs = await fetch(*args, **kw)
            for msg in msgs:
                self.deliveries.append((position_of(msg) or 0, msg.metadata.num_delivered))
            return msgs

        sub.fetch = recording_fetch  # type: ignore[method-assign]
        return sub

    def redelivered(self) -> set[int]:
        """Positions whose messages were delivered more than once."""
        return {p for p, n in self.deliveries if n >= 2}


async def durable_exists(url: str, durable: str) -> bool:
    """Whether JetStream has the durable consumer ``durable`` on the event stream."""
    nc = await nats.connect(**connect_options(url))
    try:
        await nc.jetstream().consumer_info(EVENTS_STREAM, durable)
        return True
    except NotFoundError:
        return False
    finally:
        await nc.close()


async def ack_pending(url: str, durable: str) -> int:
    """How many messages JetStream delivered to ``durable`` that wait for an ack."""
    nc = await nats.connect(**connect_options(url))
    try:
        info = await nc.jetstream().consumer_info(EVENTS_STREAM, durable)
        return int(info.num_ack_pending or 0)
    finally:
        await nc.close()


async def _no_ack_pending(url: str) -> bool:
    return await ack_pending(url, "effects") == 0


async def _elected(store: EventStore, times: int) -> bool:
    return len(await store.read_stream(lease_stream(RELAY_CHECKPOINT))) >= times


async def _settled(store: EventStore) -> bool:
    """Whether the relay and the effects consumer have both reached the head of the log."""
    head = await store.head()
    return await _at(store, RELAY_CHECKPOINT, head) and await _at(store, "effects", head)


async def _at(store: EventStore, checkpoint: str, position: int) -> bool:
    return await store.checkpoint(checkpoint) >= position
