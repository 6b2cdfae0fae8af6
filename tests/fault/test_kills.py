"""Processes SIGKILLed at named fault points; the log and every consumer stay exact."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import nats

from cairn.local.servers import ServerProcess
from events.bus import EVENTS_STREAM, Bus
from events.consumer import ConsumerRunner
from events.relay import CHECKPOINT as RELAY_CHECKPOINT
from events.store import EventStore
from events.types import ExperimentSubmitted
from tests.helpers import (
    EFFECTS_DDL,
    EffectsConsumer,
    effect_counts,
    spawn,
    wait_for_line,
    wait_until,
)


async def jetstream_count(url: str) -> int:
    nc = await nats.connect(url)
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
    await store.pool.execute(EFFECTS_DDL)
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
        head = await store.head()
        await wait_until(lambda: _at(store, RELAY_CHECKPOINT, head))
        await append_some(store, 21, 5)
        head = await store.head()
        await wait_until(lambda: _at(store, "effects", head))
        # A wake-up reads to the head, so effects can get there before the last publish.
        await wait_until(lambda: _at(store, RELAY_CHECKPOINT, head))
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
    """A consumer killed between its commit and its ack does not re-apply the redelivered messages."""
    await store.pool.execute(EFFECTS_DDL)
    relay = spawn("services.relay", "--db", db_url, "--nats", nats_server.url, env=service_env())
    consumer = spawn(
        "tests.fault.procs.effects_consumer",
        db_url,
        nats_server.url,
        env=service_env("consumer.after_commit=120"),
    )
    try:
        await asyncio.to_thread(wait_for_line, consumer, "CONSUMER-READY")
        await asyncio.sleep(0.5)  # let the durable consumer register before events flow
        await append_some(store, 1, 10)
        await asyncio.to_thread(wait_for_line, consumer, "FAULT-POINT consumer.after_commit")
        consumer.send_signal(signal.SIGKILL)
        consumer.wait(10)
        applied = await effect_counts(store)
        assert applied and set(applied.values()) == {1}
        consumer = spawn(
            "tests.fault.procs.effects_consumer", db_url, nats_server.url, env=service_env()
        )
        await append_some(store, 11, 5)
        head = await store.head()
        await wait_until(lambda: _at(store, "effects", head), timeout=40)
        await asyncio.sleep(1.0)  # give redeliveries time to (not) apply
        counts = await effect_counts(store)
        assert len(counts) == len(await store.read_all()) and set(counts.values()) == {1}
    finally:
        for proc in (relay, consumer):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


async def _at(store: EventStore, checkpoint: str, position: int) -> bool:
    return await store.checkpoint(checkpoint) >= position
