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
from collections.abc import Mapping, Sequence
from typing import Any

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

from events.envelope import RecordedEvent, stream_type_of
from events.errors import BusUnavailableError
from events.redact import redact_url

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


def position_of(msg: Any) -> int | None:
    """The global position carried by a relayed message, if any."""
    headers = getattr(msg, "headers", None) or {}
    value = headers.get(POSITION_HEADER)
    return int(value) if value is not None else None


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
        self.stubbed = 0

    @property
    def max_payload(self) -> int:
        """The largest message (body and headers) the connected server accepts, in bytes."""
        return int(self.nc.max_payload)

    @classmethod
    async def connect(cls, url: str, *, name: str = "cairn", timeout: float = 10.0) -> Bus:
        """Connects (retrying forever on later disconnects) and makes sure the streams exist."""
        try:
            nc = await nats.connect(
                url,
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
        await bus.ensure_streams()
        return bus

    async def ensure_streams(self) -> None:
        """Creates (or updates) the event and command streams."""
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
            ),
            StreamConfig(
                name=COMMANDS_STREAM,
                subjects=[f"{COMMANDS_PREFIX}.>"],
                storage=StorageType.FILE,
                retention=RetentionPolicy.LIMITS,
                max_age=24 * 3600.0,
                duplicate_window=600.0,
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
