"""The log as Server-Sent Events: ``GET /api/v1/events/stream``.

Each event leaves as ``id: <position>``, ``event: <type>``, ``data: <RecordedEvent JSON>``; a
client that reconnects with ``Last-Event-ID`` (or ``after``) resumes after that position. The
store is polled (positions are committed in order, so nothing below the cursor can appear
later); a ``: keepalive`` comment goes out when nothing happened for a while.

What one client costs the gateway is bounded whatever it does: the log is read a few rows at a
time into pages of about :data:`PAGE_BYTES` (at least one event), a page is written only once the
previous one has left, and a client that does not take a page within
:data:`SLOW_READER_SECONDS` is disconnected. It resumes from the last event it received, as after
any dropped connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time

import structlog
from aiohttp import web
from pydantic import BaseModel, Field, field_validator

from events.domain.config.secrets import CONFIG_EVENTS, mask_payload
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import TrialRequested
from events.log.errors import StoreUnavailableError
from events.log.registry import known_types
from events.log.store import EventStore
from services.api.access import readable_experiment
from services.api.auth import principal_of
from services.api.errors import bad_request, forbidden, parse
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import MAX_ID

log = structlog.get_logger("api")
routes = RouteTable("events")

POLL_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0
BATCH = 500
"""Most events in one page."""
PAGE_BYTES = 1 << 20
"""A page ends once its text passes this many bytes (a page holds at least one event)."""
PREFETCH = 8
"""Rows read from the log per round trip while a page is built (events are at most
:data:`events.log.limits.MAX_EVENT_BYTES` each, so this bounds what is held before it is sent)."""
SLOW_READER_SECONDS = 30.0
"""How long a page may wait for the client to take it before the client is disconnected."""
MAX_POSITION = 2**62
MAX_STREAMS = 100
_STREAM = re.compile(r"^[a-z][a-z0-9_]{0,40}(-[A-Za-z0-9_.:@-]{1,200})?$", re.ASCII)


class StreamQuery(BaseModel):
    """Where to start, which event types, which streams, and which experiment (its experiment
    and trial streams); a ``Last-Event-ID`` header wins over ``after``. Filters combine with
    AND."""

    after: int = Field(0, ge=0, le=MAX_POSITION, description="resume after this position")
    types: str | None = Field(None, description="comma-separated event types")
    streams: str | None = Field(
        None,
        max_length=4000,
        description="comma-separated stream ids (trial-17) or stream types (trial, agent)",
    )
    experiment_id: int | None = Field(None, ge=1, le=MAX_ID)

    @field_validator("streams")
    @classmethod
    def _streams(cls, value: str | None) -> str | None:
        if value is None:
            return None
        names = [s.strip() for s in value.split(",") if s.strip()]
        if not names:
            raise ValueError("must name at least one stream or stream type")
        if len(names) > MAX_STREAMS:
            raise ValueError(f"at most {MAX_STREAMS} streams")
        bad = [n for n in names if not _STREAM.match(n)]
        if bad:
            raise ValueError(f"not a stream id or stream type: {bad[0]!r}")
        return ",".join(names)

    def stream_filter(self) -> tuple[list[str] | None, list[str] | None]:
        """``(stream ids, stream types)`` named by ``streams``; ``(None, None)`` when unset."""
        if self.streams is None:
            return None, None
        names = self.streams.split(",")
        return [n for n in names if "-" in n], [n for n in names if "-" not in n]

    @field_validator("types")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is None:
            return None
        names = [t.strip() for t in value.split(",") if t.strip()]
        if not names:
            raise ValueError("must name at least one event type")
        unknown = sorted(set(names) - set(known_types()))
        if unknown:
            raise ValueError(f"unknown event type(s) {unknown}")
        return ",".join(names)


def _resume_after(request: web.Request, query: StreamQuery) -> int:
    header = request.headers.get("Last-Event-ID")
    if header is None or not header.strip():
        return query.after
    raw = header.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_POSITION:
        raise bad_request("Last-Event-ID: must be an event position", "Last-Event-ID")
    return int(raw)


async def _page(
    store: EventStore,
    after: int,
    types: list[str] | None,
    experiment_id: int | None,
    named: tuple[list[str] | None, list[str] | None] = (None, None),
    *,
    admin: bool = True,
) -> list[tuple[int, str, str]]:
    """The next events after ``after``: ``(position, type, RecordedEvent JSON)``, at most
    :data:`BATCH` of them and about :data:`PAGE_BYTES` (at least one); for a non-admin reader
    without the callers' addresses (``metadata.remote``)."""
    # One snapshot: a trial requested after the list of trials was read cannot have events in
    # the page, which would otherwise be skipped for good.
    async with store.read_transaction() as tx:
        streams: list[str] | None = None
        if experiment_id is not None:
            stream = experiment_stream(experiment_id)
            requested = await tx.read_streams([stream], ["TrialRequested"])
            streams = [
                stream,
                *(trial_stream(e.decode_as(TrialRequested).trial_id) for e in requested),
            ]
        out: list[tuple[int, str, str]] = []
        size = 0
        page = tx.cursor(
            after,
            types=types,
            streams=streams,
            named_streams=named[0],
            named_categories=named[1] or (),
            limit=BATCH,
            prefetch=PREFETCH,
        )
        async with contextlib.aclosing(page):
            async for event in page:
                if event.type in CONFIG_EVENTS:
                    # The stream passes the stored JSON on, its secrets masked (serialization,
                    # not field access).
                    masked = mask_payload(event.type, event.payload)
                    event = event.model_copy(update={"payload": masked})
                if not admin and event.metadata.remote is not None:
                    hidden = event.metadata.model_copy(update={"remote": None})
                    event = event.model_copy(update={"metadata": hidden})
                data = event.model_dump_json()
                out.append((event.position, event.type, data))
                size += len(data)
                if size >= PAGE_BYTES:
                    break
    return out


async def _send(response: web.StreamResponse, data: bytes) -> None:
    """Writes ``data`` and waits until it has left for the client.

    Raises:
        TimeoutError: the client did not take it within :data:`SLOW_READER_SECONDS`.
    """
    await asyncio.wait_for(response.write(data), SLOW_READER_SECONDS)


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


@routes.get(
    "/api/v1/events/stream", allow=USERS, query=StreamQuery, raw_response="text/event-stream"
)
async def event_stream(request: web.Request) -> web.StreamResponse:
    """Server-Sent Events of the log from a position on (admins: everything; users: one of
    their experiments, named by ``experiment_id``)."""
    query = parse(StreamQuery, dict(request.query))
    after = _resume_after(request, query)
    principal = principal_of(request)
    store = store_of(request)
    if query.experiment_id is not None:
        await readable_experiment(request, query.experiment_id)
    elif not principal.is_admin:
        raise forbidden("users must name one of their experiments (experiment_id)")
    types = query.types.split(",") if query.types else None
    named = query.stream_filter()
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    quiet_since = time.monotonic()
    try:
        await response.write(b": connected\n\n")
        while not _gone(request):
            page = await _page(
                store, after, types, query.experiment_id, named, admin=principal.is_admin
            )
            if page:
                chunk = "".join(
                    f"id: {position}\nevent: {kind}\ndata: {data}\n\n"
                    for position, kind, data in page
                )
                after = page[-1][0]
                del page[:]
                await _send(response, chunk.encode())
                quiet_since = time.monotonic()
                continue  # more may be waiting: read on at once
            if time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                await _send(response, b": keepalive\n\n")
                quiet_since = time.monotonic()
            await asyncio.sleep(POLL_SECONDS)
    except TimeoutError:
        log.info("event stream reader too slow; disconnected", after=after)
        if request.transport is not None:
            request.transport.abort()  # drops what it still buffers for the client
    except ConnectionResetError:
        log.debug("event stream client left", after=after)
    except StoreUnavailableError as exc:
        log.warning("event stream stopped: store unavailable", error=str(exc))
        if request.transport is not None:
            request.transport.close()
    return response
