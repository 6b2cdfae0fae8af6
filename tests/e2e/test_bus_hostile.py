"""Hostile bus traffic and revoked agents against every service as a real process: malformed
messages are logged, acked and skipped by the tracker, scheduler, searcher and agent, and a
revoked agent is declared lost."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairn.local.servers import ServerProcess
from events.domain.commands import agent_subject
from events.log.bus import COMMANDS_STREAM, EVENTS_STREAM, POSITION_HEADER, Bus
from events.log.bus_auth import agent_durable
from events.log.store import EventStore
from tests.e2e.harness import Cluster, events_of, experiment_state, wait_for
from tests.e2e.test_trials import SCRIPTED, scripted
from tests.helpers import wait_until

AGENT = "agent-a"

BAD_POSITIONS: list[str | None] = [
    None,
    "",
    "abc",
    "-5",
    "0",
    "1e3",
    "  ",
    "9" * 40,
    "١٢",  # Arabic-Indic digits: str.isdigit() says yes, a position they are not
]

BAD_COMMANDS = [
    b"not json",
    b"[1, 2, 3]",
    b'"start"',
    b'{"kind": "start"}',
    b'{"command_id": "x1", "kind": "launch", "allocation_id": "1.1"}',
    b'{"command_id": "x2", "kind": "start", "allocation_id": "../../etc"}',
    b'{"command_id": "x3", "kind": "kill", "allocation_id": "999999.1"}',
]


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Relay, searcher, scheduler, API, tracker and one 2-slot agent, as processes."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=2, agent_timeout=3.0)
    c.start("tracker", "services.tracker")
    try:
        await c.login()
        yield c
    finally:
        c.stop()


async def run_one(cluster: Cluster, store: EventStore, checkpoints: Path) -> int:
    """Submits a short experiment and waits until it completed."""
    exp = await cluster.submit(scripted(checkpoints, steps=5, sleep=0.0), SCRIPTED)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=90)
    return exp


async def test_malformed_bus_messages_are_skipped_by_every_consumer(
    cluster: Cluster, store: EventStore, nats_server: ServerProcess, tmp_path: Path
) -> None:
    """Events whose position header is missing, non-numeric or absurd, and commands that are
    not commands, published with a credential allowed to (the test's admin user), are each
    delivered to and acked by the tracker's, scheduler's, searcher's and agent's consumers,
    never redelivered; every service stays up and the next experiment completes."""
    await run_one(cluster, store, tmp_path / "ckpt")  # every consumer has bound its durable
    admin = await Bus.connect(nats_server.url)
    try:
        event_seqs: dict[str, list[int]] = {"trial": [], "experiment": []}
        for n, value in enumerate(BAD_POSITIONS):
            headers = {POSITION_HEADER: value} if value is not None else None
            for kind in event_seqs:  # the tracker's GC only follows experiment subjects
                ack = await admin.js.publish(
                    f"cairn.evt.{kind}.{kind}-{900 + n}", b"\xff not an event", headers=headers
                )
                event_seqs[kind].append(ack.seq)
        command_seqs = []
        for body in BAD_COMMANDS:
            ack = await admin.js.publish(agent_subject(AGENT), body, stream=COMMANDS_STREAM)
            command_seqs.append(ack.seq)
        consumers = {c.name: c for c in await admin.js.consumers_info(EVENTS_STREAM)}
        assert len(consumers) >= 3, consumers

        last_experiment = max(event_seqs["experiment"])
        last_any = max(last_experiment, *event_seqs["trial"])
        durables = [
            (
                EVENTS_STREAM,
                name,
                last_experiment if ".experiment." in str(info.config.filter_subject) else last_any,
            )
            for name, info in consumers.items()
        ]
        durables.append((COMMANDS_STREAM, agent_durable(AGENT), max(command_seqs)))
        seen: list[object] = []

        async def all_acked() -> bool:
            seen[:] = [await admin.js.consumer_info(s, n) for s, n, _ in durables]
            return all(
                (info.ack_floor.stream_seq or 0) >= last and info.num_ack_pending == 0
                for info, (_, _, last) in zip(seen, durables, strict=True)
            )

        await wait_until(
            all_acked,
            timeout=30,
            detail=lambda: [
                (i.name, i.ack_floor.stream_seq, i.num_ack_pending, i.num_pending, last)  # type: ignore[attr-defined]
                for i, (_, _, last) in zip(seen, durables, strict=True)
            ],
        )
        for name in consumers:
            info = await admin.js.consumer_info(EVENTS_STREAM, name)
            assert info.num_redelivered == 0, (name, info)
    finally:
        await admin.close()
    cluster.check_alive()
    logs = {p.stem: p.read_text(errors="replace") for p in sorted(tmp_path.glob("*.log"))}  # noqa: ASYNC240
    for service in ("tracker", "scheduler", "searcher"):
        assert "bus message without a valid position skipped" in logs[service], service
    assert logs[AGENT].count("malformed command dropped") >= 4, logs[AGENT][-3000:]
    await run_one(cluster, store, tmp_path / "ckpt")
    cluster.check_alive()


async def test_a_revoked_agent_is_refused_and_declared_lost(
    cluster: Cluster, store: EventStore
) -> None:
    """An admin revokes the running agent's credential: its heartbeats are refused from then
    on and the scheduler records it lost after the agent timeout."""

    async def registered() -> bool:
        return bool(await events_of(store, "AgentRegistered"))

    await wait_for(cluster, registered, timeout=30)
    listed = await cluster.request("GET", "/agent-credentials")
    assert json.dumps(listed).count("agent:") == 0  # the token itself is never listed
    await cluster.request("POST", f"/agents/{AGENT}/revoke", {})

    async def lost() -> bool:
        return any(e.payload["agent_id"] == AGENT for e in await events_of(store, "AgentLost"))

    await wait_for(cluster, lost, timeout=30)
    log = (cluster.workdir / f"{AGENT}.log").read_text(errors="replace")
    assert "heartbeat failed" in log and "401" in log, log[-2000:]
