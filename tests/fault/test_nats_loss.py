"""NATS crashes and NATS data loss: consumers heal from PostgreSQL, nothing lost or doubled."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cairn.local.servers import ServerProcess, start_nats
from events.domain.commands import agent_subject
from events.domain.types import ExperimentSubmitted, SlotsAllocated
from events.log.bus import COMMANDS_STREAM, Bus
from events.log.consumer import ConsumerRunner
from events.log.relay import CHECKPOINT as RELAY_CHECKPOINT
from events.log.relay import Relay
from events.log.store import EventStore
from tests.helpers import EFFECTS_DDL, EffectsConsumer, effect_counts, wait_until


@dataclass
class Pipeline:
    store: EventStore
    relay: Relay
    runner: ConsumerRunner

    async def settled(self) -> bool:
        head = await self.store.head()
        return (
            await self.store.checkpoint(RELAY_CHECKPOINT) >= head
            and await self.store.checkpoint("effects") >= head
        )


@pytest.fixture
async def pipeline(store: EventStore, nats_server: ServerProcess) -> AsyncIterator[Pipeline]:
    """An in-process relay and effects consumer on the test's database and nats-server."""
    await store.execute(EFFECTS_DDL)
    relay_bus = await Bus.connect(nats_server.url)
    consumer_bus = await Bus.connect(nats_server.url)
    relay = Relay(store, relay_bus)
    runner = ConsumerRunner(store, consumer_bus, EffectsConsumer(), catch_up_every=1.0)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(relay.run(stop)), asyncio.create_task(runner.run(stop))]
    yield Pipeline(store, relay, runner)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    await relay_bus.close()
    await consumer_bus.close()


async def append_burst(store: EventStore, start: int, n: int, pause: float = 0.0) -> None:
    for i in range(start, start + n):
        await store.append(f"experiment-{i}", [ExperimentSubmitted(experiment_id=i, config={})])
        if pause:
            await asyncio.sleep(pause)  # paces the burst so a fault lands mid-stream: the scenario


async def _reached(store: EventStore, checkpoint: str | None, position: int) -> bool:
    """Whether ``checkpoint`` (``None``: the head of the log) is at ``position`` or beyond."""
    at = await (store.head() if checkpoint is None else store.checkpoint(checkpoint))
    return at >= position


async def assert_exactly_once(store: EventStore) -> None:
    counts = await effect_counts(store)
    positions = [e.position for e in await store.read_all(limit=100_000)]
    assert sorted(counts) == positions, "an event was lost"
    assert set(counts.values()) == {1}, "an event was applied twice"


async def test_nats_killed_mid_stream_loses_nothing(
    pipeline: Pipeline, nats_server: ServerProcess
) -> None:
    """SIGKILL nats-server during a burst and restart it: every event is applied exactly once."""
    store = pipeline.store
    burst = asyncio.create_task(append_burst(store, 1, 60, pause=0.01))
    await wait_until(lambda: _reached(store, RELAY_CHECKPOINT, 5))  # events flow through NATS
    nats_server.kill()
    assert not burst.done(), "NATS must die mid-burst"
    down_at = await store.head()
    await wait_until(lambda: _reached(store, None, down_at + 5))  # appends go on without NATS
    restarted = start_nats(nats_server.data_dir, port=nats_server.port)
    try:
        await burst
        await append_burst(store, 100, 10)
        await wait_until(pipeline.settled, timeout=40)
        await assert_exactly_once(store)
    finally:
        restarted.stop()


async def test_nats_restored_from_older_store_heals_from_postgres(
    pipeline: Pipeline, nats_server: ServerProcess, tmp_path: Path
) -> None:
    """nats-server restarted on an older copy of its store: consumers catch up from PostgreSQL."""
    await append_burst(pipeline.store, 1, 20)
    await wait_until(pipeline.settled)
    nats_server.stop()
    snapshot = tmp_path / "nats-old"
    shutil.copytree(nats_server.data_dir, snapshot)
    server = start_nats(nats_server.data_dir, port=nats_server.port)
    await append_burst(pipeline.store, 21, 20)
    await wait_until(pipeline.settled, timeout=40)
    relayed_before = await pipeline.store.checkpoint(RELAY_CHECKPOINT)
    server.stop()
    shutil.rmtree(nats_server.data_dir)
    shutil.copytree(snapshot, nats_server.data_dir)
    server = start_nats(nats_server.data_dir, port=nats_server.port)
    try:
        await append_burst(pipeline.store, 41, 10)
        await wait_until(pipeline.settled, timeout=40)
        assert await pipeline.store.checkpoint(RELAY_CHECKPOINT) >= relayed_before
        await assert_exactly_once(pipeline.store)
    finally:
        server.stop()


async def test_a_command_lost_with_the_bus_store_is_published_again(
    pipeline: Pipeline, nats_server: ServerProcess, tmp_path: Path
) -> None:
    """nats-server restarted on a copy of its store older than an agent's ``start`` command:
    the relay sees the bus behind its checkpoint, publishes the lost tail again, and the agent's
    durable queue (as old as the copy) delivers the command."""
    setup = await Bus.connect(nats_server.url)
    await setup.pull("agent-a1", [agent_subject("a1")], stream=COMMANDS_STREAM)
    await setup.close()
    await append_burst(pipeline.store, 1, 5)
    await wait_until(pipeline.settled)
    nats_server.stop()
    snapshot = tmp_path / "nats-old"
    shutil.copytree(nats_server.data_dir, snapshot)
    server = start_nats(nats_server.data_dir, port=nats_server.port)
    allocated = SlotsAllocated(trial_id=7, allocation_id="7.1", placements={"a1": ["s0"]})
    await pipeline.store.append("trial-7", [allocated])
    await wait_until(pipeline.settled, timeout=40)
    server.stop()
    shutil.rmtree(nats_server.data_dir)
    shutil.copytree(snapshot, nats_server.data_dir)
    server = start_nats(nats_server.data_dir, port=nats_server.port)
    agent = await Bus.connect(nats_server.url)
    try:
        queue = await agent.pull("agent-a1", [agent_subject("a1")], stream=COMMANDS_STREAM)
        received: list[str] = []

        async def started() -> bool:
            try:
                for msg in await queue.fetch(10, timeout=0.5):
                    received.append(json.loads(msg.data)["command_id"])
                    await msg.ack()
            except TimeoutError:
                pass
            return "start:7.1:a1" in received

        await wait_until(started, timeout=40)
        assert pipeline.relay.rewinds >= 1, "the relay never found the bus behind its checkpoint"
        await wait_until(pipeline.settled, timeout=40)
        await assert_exactly_once(pipeline.store)
    finally:
        await agent.close()
        server.stop()
