"""The relay: publishes committed events to JetStream in position order, leader-only.

Loop: read the log after the relay checkpoint, publish the page (JetStream drops duplicates by
event id), then advance the checkpoint under the leader's fence. A crash between publish and
checkpoint only causes a republish, which consumers skip by position.

The checkpoint means "the bus holds everything up to here". A nats-server restarted on an older
copy of its store breaks that: the events and the agents' commands published since the copy are
gone, and an agent whose ``start`` command was among them would never run its allocation. So
the leader compares the last position the events stream holds with its checkpoint when it
starts leading, after the bus failed, and every :data:`BUS_CHECK_SECONDS`; when the bus is
behind, the checkpoint moves back to it and the lost tail is published again (events and
commands alike: consumers skip positions they folded, agents command ids they ran).

No single event can hold the log back: one too large for the bus is published as a stub (see
:mod:`events.log.bus`), and any other failure is logged and retried with a growing delay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from events.domain import commands
from events.log import db, faults
from events.log.bus import Bus
from events.log.errors import BusUnavailableError, FencedError, StoreUnavailableError
from events.log.lease import LeaderLease
from events.log.limits import ENVELOPE_ALLOWANCE, MAX_EVENT_BYTES
from events.log.store import NOTIFY_CHANNEL, EventStore

CHECKPOINT = "relay"
MAX_BACKOFF = 10.0
"""The longest wait, in seconds, between two attempts at a page that keeps failing."""
BUS_CHECK_SECONDS = 2.0
"""How often the leader checks that the bus still holds what it relayed (see the module doc)."""
BUS_CHECK_TIMEOUT = 1.0
"""How long one check may take; a check that fails or times out (a bus user without the right
to read the stream's last message, say) is retried less and less often, never holding back
the relaying itself."""
MAX_BUS_CHECK_SECONDS = 300.0
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
        self.rewinds = 0

    async def run(
        self,
        stop: asyncio.Event,
        *,
        on_leading: Callable[[], None] | None = None,
        on_standby: Callable[[], None] | None = None,
    ) -> None:
        """Relays while this replica holds the lease, until ``stop`` is set.

        A replica whose lease is lost, or whose checkpoint write is fenced off by a newer
        leader (it was paused while a standby took over), steps down and waits for the lease
        again.

        Args:
            stop: ends the run.
            on_leading: called each time this replica starts leading.
            on_standby: called when another replica holds the lease as this one asks for it.
        """
        while not stop.is_set():
            lease = await LeaderLease.acquire(
                self.store, CHECKPOINT, stop=stop, on_standby=on_standby
            )
            if lease is None:
                return
            try:
                await self._lead(lease, stop, on_leading)
            except FencedError as exc:
                log.warning("relay fenced off; stepping down", error=str(exc))
            finally:
                await lease.release()
            if not stop.is_set():
                log.warning("relay lease lost; standing by", epoch=lease.epoch)

    async def _lead(
        self, lease: LeaderLease, stop: asyncio.Event, on_leading: Callable[[], None] | None
    ) -> None:
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
            on_leading()
        wake = asyncio.Event()
        listener = await db.connect(self.store.dsn)
        await listener.add_listener(NOTIFY_CHANNEL, lambda *_: wake.set())
        failures = 0
        check = _BusCheck(asyncio.get_running_loop().time)
        try:
            while not stop.is_set() and not lease.lost.is_set():
                try:
                    if check.due():
                        await check.run(self.check_bus(lease))
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
                    check.soon()  # the bus may have come back on an older store
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

    async def check_bus(self, lease: LeaderLease) -> bool:
        """Moves the checkpoint back to the bus's last relayed position when the bus holds less
        than the checkpoint says (it restarted on an older store); returns whether it did."""
        on_bus = await self.bus.relayed_position()
        if on_bus is None:
            return False
        relayed = await self.store.checkpoint(CHECKPOINT)
        if on_bus >= relayed:
            return False
        log.warning(
            "the bus lost relayed events; publishing them again",
            bus_position=on_bus,
            checkpoint=relayed,
        )
        async with self.store.transaction() as tx:
            await tx.check_fence(lease.fence)
            await tx.rewind_checkpoint(CHECKPOINT, on_bus)
        self.rewinds += 1
        return True

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


class _BusCheck:
    """When the leader next compares the bus's tail with its checkpoint: at once on leading and
    after a bus failure, then every :data:`BUS_CHECK_SECONDS`, backing off while checks fail."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.next_at = 0.0
        self.every = BUS_CHECK_SECONDS

    def due(self) -> bool:
        return self.clock() >= self.next_at

    def soon(self) -> None:
        self.next_at = 0.0

    async def run(self, check: Coroutine[Any, Any, bool]) -> None:
        try:
            await asyncio.wait_for(check, BUS_CHECK_TIMEOUT)
        except (BusUnavailableError, TimeoutError) as exc:
            self.every = min(self.every * 2, MAX_BUS_CHECK_SECONDS)
            log.warning(
                "cannot read the bus's tail; relaying on",
                error=str(exc) or type(exc).__name__,
                next_check_s=self.every,
            )
        else:
            self.every = BUS_CHECK_SECONDS
        self.next_at = self.clock() + self.every
