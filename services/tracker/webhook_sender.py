"""Posting the queued webhook deliveries: per webhook in log order, retried with backoff.

Each webhook with pending deliveries gets its own worker, which takes the webhook's oldest
pending delivery (by log position), posts it, and records the attempt on its row before it
takes the next: a webhook's receiver sees its deliveries in the order of the log, and one that
hangs (each attempt ends at ``webhooks.timeout``) or fails holds up only its own worker, never
another webhook's nor any consumer of the log.

A failed attempt is retried after ``retry_delay``, doubling up to ``max_retry_delay``, until
``max_attempts``; a final failure (a 4xx, a redirect, a refused address) is not retried. Either
way the delivery ends ``failed`` and the webhook's next one goes. The time of the next attempt
is kept on the row, so a restarted tracker resumes each delivery where it stood.

At least once: a delivery is marked ``delivered`` only after the receiver answered 2xx, so a
tracker killed between the answer and that mark posts it again after its restart, under the
same delivery id (receivers drop an id they have seen).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass

import structlog
from aiohttp.abc import AbstractResolver

from events.domain.config.cluster import WebhookPolicy
from events.domain.webhooks.urls import Endpoints
from events.log import faults
from events.log.errors import EventsError
from events.log.store import EventStore
from services.tracker.webhooks import DELIVERED, FAILED, PENDING
from services.webhooks import signing
from services.webhooks.sending import Attempt, Poster

log = structlog.get_logger("tracker.webhooks")


@dataclass(frozen=True)
class _Due:
    delivery_id: uuid.UUID
    url: str
    body: str
    attempts: int
    wait: float


async def signing_secret(store: EventStore) -> bytes:
    """The cluster's webhook signing secret (created by the tracker's migrations).

    Raises:
        EventsError: the webhook tables are not migrated.
    """
    value = await store.fetchval("SELECT value FROM webhook_secrets WHERE name = 'signing'")
    if value is None:
        raise EventsError("the webhook signing secret is missing (run the tracker's migrations)")
    return bytes.fromhex(str(value))


class WebhookSender:
    """Posts pending deliveries until stopped (see the module doc).

    Args:
        store: the event store (its pool reaches the delivery table).
        policy: the cluster config's ``webhooks`` section.
        endpoints: the cluster's own services, never to be reached.
        resolver: where names are resolved (``None``: the system); a test maps names here.
        poll_every: seconds between looks for pending deliveries when nobody wakes it.
    """

    def __init__(
        self,
        store: EventStore,
        policy: WebhookPolicy,
        endpoints: Endpoints,
        *,
        resolver: AbstractResolver | None = None,
        poll_every: float = 1.0,
    ) -> None:
        self.store = store
        self.policy = policy
        self.poster = Poster(policy, endpoints, resolver)
        self.poll_every = poll_every
        self._wake = asyncio.Event()
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._secret: bytes | None = None

    def wake(self) -> None:
        """Looks for pending deliveries now (called when the consumer queued some)."""
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Starts a worker per webhook with pending deliveries, until ``stop`` is set."""
        try:
            while not stop.is_set():
                try:
                    await self._start_workers(stop)
                except EventsError as exc:
                    log.warning("looking for webhook deliveries failed", error=str(exc))
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(_either(stop, self._wake), self.poll_every)
        finally:
            for task in self._workers.values():
                task.cancel()
            await asyncio.gather(*self._workers.values(), return_exceptions=True)
            self._workers.clear()
            await self.poster.close()

    async def _start_workers(self, stop: asyncio.Event) -> None:
        if self._secret is None:
            self._secret = await signing_secret(self.store)
        rows = await self.store.fetch(
            "SELECT DISTINCT webhook_id FROM webhook_deliveries WHERE state = $1", PENDING
        )
        for webhook_id in [k for k, task in self._workers.items() if task.done()]:
            self._workers.pop(webhook_id)
        for row in rows:
            webhook_id = int(row["webhook_id"])
            worker = self._workers.get(webhook_id)
            if worker is None or worker.done():
                self._workers[webhook_id] = asyncio.create_task(
                    self._drain(webhook_id, stop), name=f"webhook-{webhook_id}"
                )

    async def _next(self, webhook_id: int) -> _Due | None:
        row = await self.store.fetchrow(
            """SELECT delivery_id, url, body, attempts,
                      greatest(0, extract(epoch FROM next_attempt_at - now()))::float8 AS wait
               FROM webhook_deliveries WHERE webhook_id = $1 AND state = $2
               ORDER BY position, delivery_id LIMIT 1""",
            webhook_id,
            PENDING,
        )
        if row is None:
            return None
        return _Due(
            row["delivery_id"], row["url"], row["body"], int(row["attempts"]), float(row["wait"])
        )

    async def _drain(self, webhook_id: int, stop: asyncio.Event) -> None:
        """Posts webhook ``webhook_id``'s pending deliveries in order until none is left."""
        while not stop.is_set():
            try:
                due = await self._next(webhook_id)
                if due is None:
                    return
                if due.wait > 0:
                    # Waiting out a backoff: look again then (the row may have been re-pointed
                    # or canceled meanwhile).
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), min(due.wait, self.poll_every * 5))
                    continue
                await self._attempt(webhook_id, due)
            except EventsError as exc:
                log.warning(
                    "webhook delivery bookkeeping failed", webhook_id=webhook_id, error=str(exc)
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_every)

    async def _attempt(self, webhook_id: int, due: _Due) -> None:
        assert self._secret is not None
        key = signing.webhook_key(self._secret, webhook_id)
        body = due.body.encode()
        delivery = str(due.delivery_id)
        attempt = await self.poster.post(
            due.url, body, signing.headers(key, int(time.time()), body, delivery)
        )
        await faults.point("webhooks.after_post")
        await self._record(due, attempt)
        log.info(
            "webhook delivery attempted",
            webhook_id=webhook_id,
            delivery_id=delivery,
            ok=attempt.ok,
            status=attempt.status,
            error=attempt.error or None,
        )

    async def _record(self, due: _Due, attempt: Attempt) -> None:
        attempts = due.attempts + 1
        if attempt.ok:
            state, retry = DELIVERED, 0.0
        elif attempt.final or attempts >= self.policy.max_attempts:
            state, retry = FAILED, 0.0
        else:
            state, retry = PENDING, self.policy.retry_after(attempts)
        await self.store.execute(
            """UPDATE webhook_deliveries
               SET state = $2, attempts = $3, last_status = $4, last_error = $5,
                   last_attempt_at = now(),
                   next_attempt_at = now() + make_interval(secs => $6),
                   delivered_at = CASE WHEN $2 = 'delivered' THEN now() END
               WHERE delivery_id = $1 AND state = 'pending'""",
            due.delivery_id,
            state,
            attempts,
            attempt.status,
            attempt.error[:1000],
            retry,
        )


async def _either(stop: asyncio.Event, wake: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


__all__ = ["WebhookSender", "signing_secret"]
