"""The relay: publishes committed events to JetStream in position order, leader-only.

Loop: read the log after the relay checkpoint, publish the page (JetStream drops duplicates by
event id), then advance the checkpoint under the leader's fence. A crash between publish and
checkpoint only causes a republish, which consumers skip by position.

No single event can hold the log back: one too large for the bus is published as a stub (see
:mod:`events.bus`), and any other failure is logged and retried with a growing delay.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from events import commands, db, faults
from events.bus import Bus
from events.errors import BusUnavailableError, EventsError, StoreUnavailableError
from events.lease import LeaderLease
from events.limits import ENVELOPE_ALLOWANCE, MAX_EVENT_BYTES
from events.store import NOTIFY_CHANNEL, EventStore

CHECKPOINT = "relay"
MAX_BACKOFF = 10.0
"""The longest wait, in seconds, between two attempts at a page that keeps failing."""
log = structlog.get_logger("relay")


class Relay:
    """Moves the log onto the bus. Run :meth:`run` in every replica; only the leader publishes."""

    def __init__(
        self, store: EventStore, bus: Bus, *, page: int = 500, idle_poll: float = 0.25
    ) -> None:
        self.store = store
        self.bus = bus
        self.page = page
        self.idle_poll = idle_poll
        self.published = 0

    async def run(self, stop: asyncio.Event, *, on_leading: asyncio.Event | None = None) -> None:
        """Waits for the lease, then relays until ``stop`` is set or the lease is lost."""
        lease = await LeaderLease.acquire(self.store, CHECKPOINT, stop=stop)
        if lease is None:
            return
        max_payload = self.bus.max_payload
        log.info("relay leading", epoch=lease.epoch, max_payload=max_payload)
        if max_payload < MAX_EVENT_BYTES + ENVELOPE_ALLOWANCE:
            log.warning(
                "the bus's max_payload is below the event size limit; large events will be "
                "relayed as stubs",
                max_payload=max_payload,
                max_event_bytes=MAX_EVENT_BYTES,
            )
        if on_leading is not None:
            on_leading.set()
        wake = asyncio.Event()
        listener = await db.connect(self.store.dsn)
        await listener.add_listener(NOTIFY_CHANNEL, lambda *_: wake.set())
        failures = 0
        try:
            while not stop.is_set():
                if lease.lost.is_set():
                    raise EventsError("relay lease lost")
                try:
                    moved = await self.step(lease)
                except (BusUnavailableError, StoreUnavailableError) as exc:
                    failures += 1
                    delay = min(self.idle_poll * 2**failures, MAX_BACKOFF)
                    log.warning(
                        "relay step failed; retrying",
                        error=str(exc),
                        attempt=failures,
                        retry_in=round(delay, 2),
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    continue
                if failures:
                    log.info("relay recovered", attempts=failures)
                    failures = 0
                if moved < self.page:
                    wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), self.idle_poll)
        finally:
            with contextlib.suppress(Exception):
                await listener.close()
            await lease.release()

    async def step(self, lease: LeaderLease) -> int:
        """Relays one page after the checkpoint; returns how many events it covered."""
        after = await self.store.checkpoint(CHECKPOINT)
        events = await self.store.read_all(after, limit=self.page)
        if not events:
            return 0
        fresh = await self.bus.publish_events(events)
        for event in events:
            for command in commands.derive(event):
                await self.bus.publish_command(
                    command.subject, command.payload(), command.command_id
                )
        await faults.point("relay.after_publish")
        async with self.store.transaction() as tx:
            await tx.check_fence(lease.fence)
            await tx.set_checkpoint(CHECKPOINT, events[-1].position)
        self.published += fresh
        return len(events)
