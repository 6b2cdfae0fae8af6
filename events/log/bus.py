"""NATS JetStream transport: the event relay's target and the consumers' wake-up source.

NATS is for latency only. Messages carry the event's global position in a header; a consumer
with database access treats a message as "the log has reached at least this position" and reads
the truth from PostgreSQL. So an event too large for the server's ``max_payload`` (one written
under another limit) is published as a stub, marked by the :data:`STUB_HEADER` header, whose
body only names the event: it wakes consumers all the same, and nothing waits behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import nats
import structlog
from nats.aio.client import Client as NatsClient
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from events.log.envelope import RecordedEvent, stream_type_of
from events.log.errors import BusUnavailableError
from events.log.redact import redact_url

EVENTS_STREAM = "CAIRN_EVENTS"
EVENTS_PREFIX = "cairn.evt"
COMMANDS_STREAM = "CAIRN_COMMANDS"
COMMANDS_PREFIX = "cairn.cmd"
POSITION_HEADER = "Cairn-Position"
MSG_ID_HEADER = "Nats-Msg-Id"
ACK_WAIT_SECONDS = 30.0
STUB_HEADER = "Cairn-Stub"
"""Present on a message whose body is a stub: the event itself is only in the log."""

log = structlog.get_logger("bus")


def subject_for(stream_id: str) -> str:
    """The subject an event of ``stream_id`` is published on (dots in ids become ``_``)."""
    return f"{EVENTS_PREFIX}.{stream_type_of(stream_id)}.{stream_id.replace('.', '_')}"


MAX_POSITION = 2**63 - 1
"""The largest position a ``bigint`` column holds; a header above it is not a position."""


def position_of(msg: Any) -> int | None:
    """The global position carried by a relayed message, or ``None`` when it carries none.

    Anything but a decimal integer in ``[1, 2**63 - 1]`` (missing, empty, non-numeric, negative,
    absurdly large, not text at all) is no position: the caller treats the message as a bare
    wake-up or skips it, never crashes on it.
    """
    headers = getattr(msg, "headers", None)
    if not isinstance(headers, Mapping):
        return None
    value = headers.get(POSITION_HEADER)
    if not isinstance(value, str) or not value.isascii() or not value.strip().isdigit():
        return None
    if len(value.strip()) > 19:
        return None
    position = int(value)
    return position if 1 <= position <= MAX_POSITION else None


CREDS_PARAM = "creds"
"""The query parameter of a NATS URL that names the user's credentials file (a path, never the
secret itself), as a PostgreSQL DSN's ``sslkey`` names a key file:
``nats://127.0.0.1:4222?creds=/data/nats-auth/relay.creds``."""

MAX_REPLICAS = 5
"""The most copies of a stream JetStream keeps (one per server of a cluster)."""
CLUSTER_REPLICAS = 3
"""The copies of each stream a bus of several servers keeps unless configured otherwise: one
server of three may die and the stream still has a quorum."""
PING_INTERVAL_SECONDS = 5.0
"""How often the client pings its server. A connection whose peer vanished without a reset (a
cut link, a partition that drops packets) is only noticed by unanswered pings: nats-py's
default (every 2 minutes, 2 outstanding) leaves a service deaf for minutes. Pinging every few
seconds costs one tiny PING/PONG per connection each interval, which a server with thousands
of connections barely notices; much lower, and a busy server's or a slow link's late PONG
would drop healthy connections."""
MAX_OUTSTANDING_PINGS = 3
"""Pings left unanswered before the client drops the connection and reconnects (to another
server of a cluster): a silent partition is noticed within about
``PING_INTERVAL_SECONDS * (MAX_OUTSTANDING_PINGS + 1)``, 20 s, instead of minutes; one or two
lost PONGs (a lossy link) do not yet cost a reconnect."""


class BusUrlError(ValueError):
    """A NATS URL that names no server, or two different credentials files."""


def server_urls(url: str) -> list[str]:
    """The servers a NATS URL names, in order, without credentials.

    A URL names one server (``nats://a:4222``) or a cluster's servers separated by commas
    (``nats://a:4222,nats://b:4222,nats://c:4222``); the client connects to one of them and
    reconnects to another when it dies. Blanks around the commas are ignored.

    Raises:
        BusUrlError: the URL names no server.
    """
    servers = [split_url(part)[0] for part in _parts(url)]
    if not servers:
        raise BusUrlError(f"the NATS URL {url!r} names no server")
    return servers


def _parts(url: str) -> list[str]:
    return [part.strip() for part in url.split(",") if part.strip()]


def _split_one(url: str) -> tuple[str, Path | None]:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    creds = query.pop(CREDS_PARAM, [None])[-1]
    rest = "&".join(f"{k}={v}" for k, values in query.items() for v in values)
    bare = urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment))
    return bare, Path(creds) if creds else None


def split_url(url: str) -> tuple[str, Path | None]:
    """``url`` without its :data:`CREDS_PARAM`, and the credentials path it named (if any).

    A cluster's URL (servers separated by commas) may name the credentials file on any one of
    its servers, conventionally the last; every server of a cluster knows the same users, so
    the one file logs in to whichever the client reaches.

    Raises:
        BusUrlError: two servers of the URL name different credentials files.
    """
    bares: list[str] = []
    named: Path | None = None
    for part in _parts(url) or [url]:
        bare, creds = _split_one(part)
        bares.append(bare)
        if creds is not None and named is not None and creds != named:
            raise BusUrlError(
                f"the NATS URL names two credentials files ({named} and {creds}); the servers "
                "of a cluster share their users: name one file once, after the last server"
            )
        named = creds or named
    return ",".join(bares), named


def with_creds(url: str, creds: Path | str) -> str:
    """``url`` naming ``creds`` as its credentials file (replacing any it named), after its
    last server."""
    bare, _ = split_url(url)
    last = bare.rsplit(",", 1)[-1]
    return f"{bare}{'&' if '?' in last else '?'}{CREDS_PARAM}={os.fspath(creds)}"


def default_replicas(url: str) -> int:
    """The copies of each stream a bus reached at ``url`` keeps when none are configured: one
    for a single server, :data:`CLUSTER_REPLICAS` for a cluster of that many servers or more
    (fewer when the URL names only two)."""
    return min(len(server_urls(url)), CLUSTER_REPLICAS)


def connect_options(url: str, *, creds: Path | None = None) -> dict[str, Any]:
    """The ``nats.connect`` keyword arguments for ``url``: its servers (one, or a cluster's,
    separated by commas) and, when ``url`` (or ``creds``, which wins) names one, the
    credentials file to log in with; pings every :data:`PING_INTERVAL_SECONDS`, giving up
    after :data:`MAX_OUTSTANDING_PINGS` unanswered."""
    _, named = split_url(url)
    path = creds or named
    options: dict[str, Any] = {
        "servers": server_urls(url),
        "ping_interval": PING_INTERVAL_SECONDS,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
    }
    if path is not None:
        options["user_credentials"] = os.fspath(path)
    return options


def headers_size(headers: Mapping[str, str]) -> int:
    """The bytes ``headers`` add to a message on the wire (the server counts them against
    ``max_payload`` together with the body)."""
    lines = sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())
    return len(b"NATS/1.0\r\n") + lines + 2


def stub_body(event: RecordedEvent, size: int) -> bytes:
    """The body published instead of an event of ``size`` bytes that the bus cannot carry."""
    return json.dumps(
        {
            "position": event.position,
            "event_id": str(event.event_id),
            "stream_id": event.stream_id,
            "type": event.type,
            "size": size,
            "stub": "too large for the bus; read the event from the log at its position",
        }
    ).encode()


class Bus:
    """A NATS connection with JetStream, plus the few operations cairn needs on it."""

    def __init__(self, nc: NatsClient, js: JetStreamContext) -> None:
        self.nc = nc
        self.js = js
        self.replicas = 1
        """The copies of each stream :meth:`ensure_streams` asks JetStream to keep (set by
        :meth:`connect`)."""
        self.stubbed = 0
        self.inbox_prefix: str | None = None
        """Where replies reach this connection (set by :meth:`connect`)."""

    @property
    def max_payload(self) -> int:
        """The largest message (body and headers) the connected server accepts, in bytes."""
        return int(self.nc.max_payload)

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str = "cairn",
        timeout: float = 10.0,
        creds: Path | None = None,
        inbox_prefix: str | None = None,
        manage_streams: bool = True,
        replicas: int | None = None,
    ) -> Bus:
        """Connects (retrying forever on later disconnects) and makes sure the streams exist.

        On a cluster the client connects to one server of ``url`` and, when that one dies or
        leaves, reconnects to another (those ``url`` names and those the cluster announced).

        Args:
            url: the server, or a cluster's servers separated by commas, optionally naming a
                credentials file (:data:`CREDS_PARAM`).
            name: the connection's name in the server's lists.
            timeout: seconds for the connection and each JetStream request.
            creds: a credentials file that overrides the one ``url`` names.
            inbox_prefix: where replies reach this connection (an agent's user may subscribe
                only below its own prefix; see :mod:`events.log.bus_auth`).
            manage_streams: create or update the streams (an agent may not).
            replicas: the copies of each stream JetStream keeps, 1 to :data:`MAX_REPLICAS`
                (``None``: :func:`default_replicas` of ``url``); at most the cluster's servers.

        Raises:
            BusUrlError: ``url`` names no server, or ``replicas`` is out of range (final).
            BusUnavailableError: no server answered, or the streams cannot be set up
                (retryable).
        """
        options = connect_options(url, creds=creds)
        copies = default_replicas(url) if replicas is None else replicas
        if not 1 <= copies <= MAX_REPLICAS:
            raise BusUrlError(f"NATS stream replicas must be 1 to {MAX_REPLICAS}, not {copies}")
        if inbox_prefix is not None:
            options["inbox_prefix"] = inbox_prefix
        try:
            nc = await nats.connect(
                **options,
                name=name,
                connect_timeout=timeout,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                error_cb=_quiet,
                disconnected_cb=_noop,
                reconnected_cb=_noop,
            )
        except Exception as exc:  # nats raises a zoo of types on connect
            raise BusUnavailableError(
                f"cannot connect to NATS at {redact_url(url)}: {exc}"
            ) from exc
        bus = cls(nc, nc.jetstream(timeout=timeout))
        bus.replicas = copies
        bus.inbox_prefix = inbox_prefix
        if manage_streams:
            try:
                await bus.ensure_streams()
            except BusUnavailableError:
                await bus.close()
                raise
        return bus

    async def ensure_streams(self) -> None:
        """Creates (or updates) the event and command streams, each with :attr:`replicas`
        copies (an existing stream is scaled to that many)."""
        configs = [
            StreamConfig(
                name=EVENTS_STREAM,
                subjects=[f"{EVENTS_PREFIX}.>"],
                storage=StorageType.FILE,
                retention=RetentionPolicy.LIMITS,
                discard=DiscardPolicy.OLD,
                max_age=7 * 24 * 3600.0,
                duplicate_window=120.0,
                deny_delete=True,
                num_replicas=self.replicas,
            ),
            StreamConfig(
                name=COMMANDS_STREAM,
                subjects=[f"{COMMANDS_PREFIX}.>"],
                storage=StorageType.FILE,
                retention=RetentionPolicy.LIMITS,
                max_age=24 * 3600.0,
                duplicate_window=600.0,
                num_replicas=self.replicas,
            ),
        ]
        try:
            for config in configs:
                try:
                    await self.js.stream_info(config.name or "")
                    await self.js.update_stream(config)
                except NotFoundError:
                    await self.js.add_stream(config)
        except Exception as exc:
            raise BusUnavailableError(f"cannot set up JetStream streams: {exc}") from exc

    async def publish_events(self, events: Sequence[RecordedEvent]) -> int:
        """Publishes events (deduplicated by event id); returns how many were new to JetStream.

        An event that does not fit the server's ``max_payload`` goes out as a stub (see
        :func:`stub_body`) instead of failing the page again and again.
        """

        async def one(event: RecordedEvent) -> bool:
            subject = subject_for(event.stream_id)
            headers = {MSG_ID_HEADER: str(event.event_id), POSITION_HEADER: str(event.position)}
            body = event.model_dump_json().encode()
            size = len(body) + headers_size(headers)
            if size <= self.max_payload:
                try:
                    ack = await self.js.publish(
                        subject, body, stream=EVENTS_STREAM, headers=headers
                    )
                    return not ack.duplicate
                except MaxPayloadError:  # the server's limit changed under us
                    pass
            log.warning(
                "event too large for the bus; published as a stub",
                position=event.position,
                stream_id=event.stream_id,
                type=event.type,
                size=size,
                max_payload=self.max_payload,
            )
            self.stubbed += 1
            ack = await self.js.publish(
                subject,
                stub_body(event, size),
                stream=EVENTS_STREAM,
                headers={**headers, STUB_HEADER: "too-large"},
            )
            return not ack.duplicate

        try:
            results = await asyncio.gather(*(one(e) for e in events))
        except Exception as exc:
            raise BusUnavailableError(f"publish failed: {exc}") from exc
        return sum(results)

    async def relayed_position(self) -> int | None:
        """The log position of the last event the events stream holds (``None`` when it holds
        none, or its last message carries no position).

        After nats-server restarts on an older copy of its store this is below what the relay
        published: the relay compares it with its checkpoint to publish the lost tail again.

        Raises:
            BusUnavailableError: the stream cannot be read.
        """
        try:
            info = await self.js.stream_info(EVENTS_STREAM)
            if not info.state.messages or not info.state.last_seq:
                return None
            last = await self.js.get_msg(EVENTS_STREAM, seq=info.state.last_seq)
        except NotFoundError:
            return None
        except Exception as exc:
            raise BusUnavailableError(f"cannot read the events stream: {exc}") from exc
        return position_of(last)

    async def publish_command(self, subject: str, payload: bytes, command_id: str) -> None:
        """Publishes a command (deduplicated by ``command_id``) on the command stream."""
        try:
            await self.js.publish(
                subject, payload, stream=COMMANDS_STREAM, headers={MSG_ID_HEADER: command_id}
            )
        except Exception as exc:
            raise BusUnavailableError(f"command publish failed: {exc}") from exc

    async def pull(
        self,
        durable: str,
        subjects: Sequence[str],
        *,
        stream: str = EVENTS_STREAM,
        ack_wait: float = ACK_WAIT_SECONDS,
    ) -> JetStreamContext.PullSubscription:
        """Binds (creating if needed) a durable pull consumer that delivers only new messages.

        Args:
            durable: the durable consumer's name.
            subjects: the subjects it receives.
            stream: the JetStream stream it reads.
            ack_wait: seconds JetStream waits for an ack before redelivering a message; set
                when the durable is created (binding to an existing one keeps its setting).
        """
        config = ConsumerConfig(
            durable_name=durable,
            deliver_policy=DeliverPolicy.NEW,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_deliver=20,
            max_ack_pending=10_000,
            filter_subjects=list(subjects) if len(subjects) > 1 else None,
            filter_subject=subjects[0] if len(subjects) == 1 else None,
        )
        try:
            return await self.js.pull_subscribe(
                subjects[0] if len(subjects) == 1 else "",
                durable=durable,
                stream=stream,
                config=config,
            )
        except Exception as exc:
            raise BusUnavailableError(f"cannot subscribe {durable}: {exc}") from exc

    async def close(self) -> None:
        """Flushes what is buffered (acks) and closes the connection.

        No drain: a pull subscription's pending fetch would hold a drain until its timeout, and
        nothing else is in flight (JetStream publishes await their acks).
        """
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.nc.flush(), 2)
        with contextlib.suppress(Exception):
            await self.nc.close()


async def _quiet(exc: Exception) -> None:
    """Connection errors are expected during NATS restarts; the client reconnects by itself."""


async def _noop() -> None:
    pass
