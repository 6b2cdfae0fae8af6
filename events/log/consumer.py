"""Checkpointed, idempotent consumers of the log.

A bus message at position p is only a wake-up: the runner locks the consumer's checkpoint row,
reads (checkpoint, head] from PostgreSQL, applies those events in order and moves the checkpoint,
all in one transaction, and acks the message only after that commit. A redelivered or duplicate
message finds p <= checkpoint and changes nothing; a lost one is healed by the periodic catch-up,
which does the same read. A message whose position header is missing or not a position (see
:func:`events.log.bus.position_of`) is logged and acked with its page: it never stops the consumer
and is never redelivered.

Invariants:

- Effects commit with the checkpoint: whatever a consumer writes through ``tx`` commits in the
  transaction that moves its checkpoint past the events that caused it, or not at all.
- A decider decides only on a state that includes its own earlier decisions: ``before_commit``
  runs only on a page that reached the head of the log as read in its transaction. Every earlier
  transaction of this runner has committed by then, so its decisions are below that head and
  folded. (Reading only up to a wake-up's p would stop short of decisions appended after p and
  decide them again.)
- A decider appends with the stream versions its state has seen (``expected_version``). A plan
  made stale by another writer between the read and the append loses with
  :class:`~events.log.errors.ConcurrencyError`: the transaction rolls back, the consumer rebuilds its
  state and the runner re-plans at once on a fresh read.
- A projection (``Consumer.projection``: it only writes tables derived from the log, appends
  nothing and touches nothing outside the database) commits without waiting for its WAL to
  reach the disk (``synchronous_commit = off``). A crash of PostgreSQL itself may then lose its
  last few commits, but always whole: effects and checkpoint go together, so on restart it
  applies those events again from the older checkpoint, exactly once. Its sources, the events,
  are committed durably by their writers; the wait saved is a disk flush per page, which
  otherwise queues behind (and in front of) the appends' own flushes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import structlog
from nats.errors import TimeoutError as NatsTimeoutError

from events.log import faults
from events.log.bus import ACK_WAIT_SECONDS, EVENTS_PREFIX, POSITION_HEADER, Bus, position_of
from events.log.envelope import RecordedEvent
from events.log.errors import ConcurrencyError, EventsError, FencedError
from events.log.store import EventStore, Fence, Transaction

log = structlog.get_logger("consumer")


class Consumer:
    """Subclass and implement :meth:`handle`. Effects go through ``tx`` so they commit atomically
    with the checkpoint.

    Attributes:
        name: the checkpoint name; unique per consumer.
        subjects: bus subjects whose messages wake this consumer.
        types: event types to receive (``None``: all); others only move the checkpoint.
        envelopes: stream types (``trial``, ``agent``, ...) whose events outside ``types`` are
            received too, as envelopes with an empty payload, so that a decider appending to
            those streams knows each one's version from ``RecordedEvent.stream_version``.
        tick_always: call :meth:`before_commit` on every catch-up, even with no new events
            (for decisions driven by time, such as heartbeat timeouts).
        projection: the consumer only writes tables derived from the log through ``tx``: it
            appends nothing, has no effect outside the database and no ``after_commit``. Its
            transactions then commit asynchronously (see the module's invariants).
    """

    name: str = "consumer"
    subjects: Sequence[str] = (f"{EVENTS_PREFIX}.>",)
    types: frozenset[str] | None = None
    envelopes: frozenset[str] = frozenset()
    tick_always: bool = False
    projection: bool = False

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        """Applies one event inside the consumer's transaction."""
        raise NotImplementedError

    async def handle_page(self, tx: Transaction, events: Sequence[RecordedEvent]) -> None:
        """Applies a page of events, in log order, inside the consumer's transaction.

        The default calls :meth:`handle` for each; a consumer may override it to apply runs of
        events in batches, provided the effects equal those of applying them one by one.
        """
        for event in events:
            await self.handle(tx, event)

    async def before_commit(self, tx: Transaction) -> None:
        """Runs inside the transaction of the last page of a catch-up, after :meth:`handle`, on a
        state folded up to the head of the log: the place to append decisions so they commit
        with the checkpoint. A :class:`~events.log.errors.ConcurrencyError` raised here means the
        plan lost a race; the runner rolls back, calls :meth:`on_rollback` and re-plans."""

    async def on_rollback(self) -> None:
        """Runs when a page's transaction failed; in-memory state must be rebuilt."""

    async def on_lost_race(self) -> None:
        """Runs when a page's plan lost a race (``ConcurrencyError``) and was rolled back.

        The events the page folded are facts of the log all the same; only the decisions and
        the checkpoint were rolled back, and the page is read again. The default rebuilds like
        :meth:`on_rollback`; a consumer whose fold skips events it has folded already may keep
        its state.
        """
        await self.on_rollback()

    async def after_commit(self) -> None:
        """Runs after each committed batch (e.g. to publish commands derived from new state)."""


class PageConsumer(Consumer):
    """A consumer that implements :meth:`handle_page` only: one event is a page of one."""

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        """Applies one event as a page of one (see :meth:`handle_page`).

        Raises:
            EventsError: the database refused a statement (the page is retried).
        """
        await self.handle_page(tx, [event])

    async def handle_page(self, tx: Transaction, events: Sequence[RecordedEvent]) -> None:
        """Applies a page of events, in log order, inside the consumer's transaction."""
        raise NotImplementedError


class ConsumerRunner:
    """Drives a :class:`Consumer` from bus wake-ups and a catch-up timer."""

    def __init__(
        self,
        store: EventStore,
        bus: Bus | None,
        consumer: Consumer,
        *,
        batch: int = 500,
        catch_up_every: float = 2.0,
        fence: Fence | None = None,
        ack_wait: float = ACK_WAIT_SECONDS,
        max_replans: int = 8,
    ) -> None:
        self.store = store
        self.bus = bus
        self.consumer = consumer
        self.batch = batch
        self.catch_up_every = catch_up_every
        self.fence = fence
        self.ack_wait = ack_wait
        self.max_replans = max_replans
        self.applied = 0
        self.replans = 0
        self._lock = asyncio.Lock()

    async def catch_up(self, upto: int | None = None) -> int:
        """Applies every event up to the head of the log; returns the new checkpoint.

        ``upto`` is a wake-up's position: at or below the checkpoint it is stale and nothing is
        read. A page that loses a race (a stale plan) is rolled back and re-planned at once, up
        to ``max_replans`` times in a row; after that the error goes to the caller, whose next
        catch-up tries again.
        """
        async with self._lock:
            lost = 0
            while True:
                try:
                    done, position, applied = await self._apply_page(upto)
                except ConcurrencyError as exc:
                    await self.consumer.on_lost_race()
                    lost += 1
                    self.replans += 1
                    if lost > self.max_replans:
                        raise
                    log.info(
                        "plan lost a race; re-planning",
                        consumer=self.consumer.name,
                        stream=exc.stream_id,
                        expected=exc.expected,
                        actual=exc.actual,
                    )
                    continue
                except BaseException:
                    await self.consumer.on_rollback()
                    raise
                if applied:
                    await faults.point("consumer.after_commit")
                if done:
                    await self.consumer.after_commit()
                    return position

    async def _apply_page(self, upto: int | None) -> tuple[bool, int, int]:
        name = self.consumer.name
        async with self.store.transaction() as tx:
            tx.write_as(self.fence)
            if self.consumer.projection:
                await tx.conn.execute("SET LOCAL synchronous_commit = off")
            checkpoint = await tx.lock_checkpoint(name)
            if upto is not None and upto <= checkpoint:
                return True, checkpoint, 0
            head = int(await tx.conn.fetchval("SELECT coalesce(max(position), 0) FROM events"))
            if head <= checkpoint:
                if self.consumer.tick_always and upto is None:
                    await self.consumer.before_commit(tx)
                    if self.fence is not None:
                        await tx.check_fence(self.fence)
                return True, checkpoint, 0
            events = await tx.read_all(
                checkpoint,
                upto=head,
                limit=self.batch,
                types=self.consumer.types,
                envelopes=self.consumer.envelopes,
            )
            await self.consumer.handle_page(tx, events)
            full = len(events) == self.batch
            if not full:
                # The state has reached the head (see the module's invariants): decide now.
                await self.consumer.before_commit(tx)
            position = events[-1].position if full else head
            if self.fence is not None:
                await tx.check_fence(self.fence)
            await tx.set_checkpoint(name, position)
            self.applied += len(events)
        return not full, position, len(events)

    async def run(self, stop: asyncio.Event) -> None:
        """Consumes until ``stop`` is set. Survives bus and database outages by retrying.

        Raises:
            FencedError: the runner's fence is stale (a newer leader was elected); a runner
                never retries a fenced write.
        """
        loops = [
            asyncio.create_task(self._timer(stop)),
            asyncio.create_task(self._consume_bus(stop)),
        ]
        try:
            await asyncio.wait(loops, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in loops:
                task.cancel()
            outcomes = await asyncio.gather(*loops, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome

    async def _timer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.catch_up()
            except FencedError:
                raise
            except EventsError as exc:
                log.warning("catch-up failed", consumer=self.consumer.name, error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.catch_up_every)

    async def _consume_bus(self, stop: asyncio.Event) -> None:
        if self.bus is None:
            await stop.wait()
            return
        sub = None
        while not stop.is_set():
            try:
                if sub is None:
                    sub = await self.bus.pull(
                        self.consumer.name, self.consumer.subjects, ack_wait=self.ack_wait
                    )
                msgs = await sub.fetch(batch=256, timeout=1.0)
            except (NatsTimeoutError, TimeoutError):
                continue
            except Exception as exc:  # bus down, consumer deleted by a restored store, ...
                log.warning("bus fetch failed", consumer=self.consumer.name, error=str(exc))
                sub = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
                continue
            positions = []
            for msg in msgs:
                position = position_of(msg)
                if position is None:
                    # Not a relayed event (a forged or damaged message): it wakes nobody; it is
                    # acked with the rest so that it is never delivered again.
                    log.warning(
                        "bus message without a valid position skipped",
                        consumer=self.consumer.name,
                        subject=str(getattr(msg, "subject", ""))[:200],
                        header=repr((getattr(msg, "headers", None) or {}).get(POSITION_HEADER))[
                            :100
                        ],
                    )
                else:
                    positions.append(position)
            try:
                if positions:
                    await self.catch_up(max(positions))
            except FencedError:
                raise
            except EventsError as exc:
                log.warning("apply failed", consumer=self.consumer.name, error=str(exc))
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.nak(delay=1.0)
                continue
            for msg in msgs:
                with contextlib.suppress(Exception):
                    await msg.ack()
