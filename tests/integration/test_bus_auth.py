"""Who may speak on the bus, against a real nats-server in operator mode: anonymous clients and
strangers are refused, an agent reads only its own command subject, and only the relay can put
an event or a command on the bus."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import ConsumerConfig

from cairn.local.servers import ServerProcess, nats_auth_dir, nats_authority, nats_url_as
from events.domain.commands import agent_subject
from events.log.bus import COMMANDS_STREAM, EVENTS_STREAM, Bus, connect_options, with_creds
from events.log.bus_auth import Authority, agent_durable, agent_inbox, write_private
from tests.helpers import wait_until


class Client:
    """A raw NATS connection as one user, recording the permission errors the server sends."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: NatsClient | None = None

    async def connect(self, url: str, **options: Any) -> Client:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        self.nc = await nats.connect(
            **connect_options(url),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=10,
            error_cb=on_error,
            **options,
        )
        return self

    def violations(self, kind: str, subject: str) -> bool:
        return any(
            f"permissions violation for {kind} to" in e and subject.lower() in e.lower()
            for e in self.errors
        )

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()


def agent_creds(server: ServerProcess, agent_id: str, tmp: Path) -> str:
    """A URL naming a freshly issued NATS user of agent ``agent_id`` (as the API issues them)."""
    authority = nats_authority(nats_auth_dir(server.data_dir))
    path = tmp / f"{agent_id}.creds"
    write_private(path, authority.user_creds(f"agent-{agent_id}", "agent", agent_id=agent_id))
    return with_creds(server.url, path)


@pytest.fixture
async def relay_bus(nats_server: ServerProcess) -> AsyncIterator[Bus]:
    """The relay's connection (it makes the streams)."""
    bus = await Bus.connect(nats_url_as(nats_server.url, "relay"))
    yield bus
    await bus.close()


async def stream_messages(bus: Bus, stream: str) -> int:
    return int((await bus.js.stream_info(stream)).state.messages)


async def test_anonymous_and_foreign_clients_are_refused(
    nats_server: ServerProcess, tmp_path: Path
) -> None:
    """A client without credentials, and one whose user another cluster's key signed (an agent
    user of a look-alike cluster), cannot connect at all."""
    with pytest.raises(nats.errors.Error) as anonymous:
        await Client().connect(f"nats://127.0.0.1:{nats_server.port}")
    assert "Authorization Violation" in str(anonymous.value)
    foreign = tmp_path / "foreign.creds"
    write_private(foreign, Authority.create().user_creds("a1", "agent", agent_id="a1"))
    with pytest.raises(nats.errors.Error) as stranger:
        await Client().connect(with_creds(nats_server.url, foreign))
    assert "Authorization Violation" in str(stranger.value)


async def test_an_agent_reads_only_its_own_command_subject(
    nats_server: ServerProcess, relay_bus: Bus, tmp_path: Path
) -> None:
    """Agent a1's user receives a1's command through its durable, but cannot subscribe to a2's
    subject, bind a2's durable, filter its own durable on a2's subject, or listen on another
    inbox: a2's command stays unread by anyone but a2."""
    for agent in ("a1", "a2"):
        await relay_bus.publish_command(agent_subject(agent), b'{"kind":"kill"}', f"k-{agent}")
    mine = await Bus.connect(
        agent_creds(nats_server, "a1", tmp_path),
        inbox_prefix=agent_inbox("a1"),
        manage_streams=False,
    )
    try:
        sub = await mine.pull(agent_durable("a1"), [agent_subject("a1")], stream=COMMANDS_STREAM)
        # The durable delivers only new messages; publish one more for a1 now.
        await relay_bus.publish_command(agent_subject("a1"), b'{"kind":"start"}', "s-a1")
        got = await sub.fetch(1, timeout=10)
        assert [m.subject for m in got] == [agent_subject("a1")]
    finally:
        await mine.close()

    raw = await Client().connect(
        agent_creds(nats_server, "a1", tmp_path), inbox_prefix=agent_inbox("a1")
    )
    try:
        assert raw.nc is not None
        await raw.nc.subscribe(agent_subject("a2"))
        await raw.nc.subscribe("_INBOX.>")
        await raw.nc.subscribe("cairn.evt.>")
        js = raw.nc.jetstream(timeout=3)
        with pytest.raises(Exception):  # noqa: B017  (a timeout: the server drops the request)
            await js.pull_subscribe(
                agent_subject("a2"), durable=agent_durable("a2"), stream=COMMANDS_STREAM
            )
        mine_on_theirs = agent_durable("a1")
        for config in (
            ConsumerConfig(
                name=mine_on_theirs, durable_name=mine_on_theirs, filter_subject=agent_subject("a2")
            ),
            ConsumerConfig(durable_name=mine_on_theirs, filter_subject=agent_subject("a2")),
        ):
            with pytest.raises(Exception):  # noqa: B017
                await js.add_consumer(COMMANDS_STREAM, config)
        await wait_until(
            lambda: (
                raw.violations("subscription", agent_subject("a2"))
                and raw.violations("subscription", "_INBOX.>")
                and raw.violations("subscription", "cairn.evt.>")
                and raw.violations(
                    "publish", f"CONSUMER.INFO.{COMMANDS_STREAM}.{agent_durable('a2')}"
                )
            ),
            timeout=10,
            detail=lambda: raw.errors,
        )
    finally:
        await raw.close()
    admin = await Bus.connect(nats_server.url)
    try:
        info = await admin.js.consumer_info(COMMANDS_STREAM, agent_durable("a1"))
        assert info.config.filter_subject == agent_subject("a1")
        assert info.num_pending == 0  # nothing of a2's reached a1's durable
    finally:
        await admin.close()


@pytest.mark.parametrize("user", ["agent", "scheduler", "searcher", "tracker", "api"])
async def test_only_the_relay_puts_events_and_commands_on_the_bus(
    nats_server: ServerProcess, relay_bus: Bus, tmp_path: Path, user: str
) -> None:
    """An agent's or another service's user publishing an event (``cairn.evt.>``) or a forged
    ``kill``/``start`` (``cairn.cmd.agent.<id>``) is refused by the server: neither stream
    grows, so no consumer or agent ever sees them."""
    url = (
        agent_creds(nats_server, "a1", tmp_path)
        if user == "agent"
        else nats_url_as(nats_server.url, user)
    )
    events = await stream_messages(relay_bus, EVENTS_STREAM)
    commands = await stream_messages(relay_bus, COMMANDS_STREAM)
    client = await Client().connect(url)
    forged = {
        "cairn.evt.trial.trial-1": b'{"type":"TrialExited"}',
        agent_subject("a1"): b'{"command_id":"kill:1.1:a1","kind":"kill","allocation_id":"1.1"}',
        agent_subject("a2"): b'{"command_id":"start:1.1:a2","kind":"start","allocation_id":"1.1"}',
    }
    try:
        assert client.nc is not None
        js = client.nc.jetstream(timeout=2)
        for subject, body in forged.items():
            with pytest.raises(Exception):  # noqa: B017  (no ack: the server dropped it)
                await js.publish(subject, body, headers={"Cairn-Position": "1"})
            await client.nc.publish(subject, body)  # a plain publish, without waiting for an ack
        await client.nc.flush()
        await wait_until(
            lambda: all(client.violations("publish", s) for s in forged),
            timeout=10,
            detail=lambda: client.errors,
        )
    finally:
        await client.close()
    assert await stream_messages(relay_bus, EVENTS_STREAM) == events
    assert await stream_messages(relay_bus, COMMANDS_STREAM) == commands


async def test_the_relay_may_read_the_last_relayed_position(
    nats_server: ServerProcess, relay_bus: Bus
) -> None:
    """The relay's user may read the events stream's last message, which is how the relay finds
    the bus behind its checkpoint after nats-server restarts on an older store."""
    await relay_bus.ensure_streams()
    await relay_bus.js.publish(
        "cairn.evt.trial.trial-1", b"{}", stream=EVENTS_STREAM, headers={"Cairn-Position": "41"}
    )
    assert await relay_bus.relayed_position() == 41
