"""Asynchronous, batched, idempotent delivery of a trial's reports.

The training loop only appends to a queue; a background thread posts the queue to
``POST /api/v1/trials/{trial_id}/reports`` every 0.5 s (or as soon as 500 items wait), retrying
with exponential backoff. Each item carries the idempotency key ``<allocation>:<seq>``, so a
retried batch the server already applied is a no-op. :meth:`HTTPReporter.close` (called by
``Context.close()``, the context manager's exit and ``atexit``) flushes and waits, bounded.
A refusal saying the run is no longer current ends the process (:mod:`cairn.core._run_gone`).
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import sys
import threading
import time
from typing import Any

from cairn.core._http import HTTPStatusError, Session
from cairn.core._run_gone import RunGoneHandler, error_message, exit_run_gone, is_run_gone

log = logging.getLogger("cairn.core")

FLUSH_EVERY = 0.5
MAX_BATCH = 500
CLOSE_TIMEOUT = 30.0


class Reporter:
    """Where reports go. Subclasses deliver them; this base drops them (non-chief ranks)."""

    def submit(self, item: dict[str, Any]) -> None:
        """Queues one report item (``kind`` plus its fields); never blocks on the network."""

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until everything submitted so far is delivered; False on timeout."""
        return True

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Flushes (bounded by ``timeout``) and stops; False if some reports were lost."""
        return True


class LocalReporter(Reporter):
    """Off-cluster: reports are printed to stderr (and kept in :attr:`items`)."""

    def __init__(self, stream: Any = None) -> None:
        self.items: list[dict[str, Any]] = []
        self._stream = stream
        self._seq = 0
        self._lock = threading.Lock()

    def submit(self, item: dict[str, Any]) -> None:
        """Prints the item as one ``[cairn.core] ...`` line."""
        with self._lock:
            self._seq += 1
            item = {**item, "idempotency_key": f"local:{self._seq}"}
            self.items.append(item)
        fields = {k: v for k, v in item.items() if k not in ("kind", "idempotency_key", "run_id")}
        stream = self._stream or sys.stderr
        print(f"[cairn.core] {item['kind']}: {json.dumps(fields, default=str)}", file=stream)


class HTTPReporter(Reporter):
    """On-cluster: batches items and posts them from a daemon thread.

    Args:
        session: the HTTP session (master URL + trial token).
        trial_id: the trial whose reports these are.
        allocation_id: prefix of the idempotency keys.
        flush_every: the longest an item waits before being sent, in seconds.
        max_batch: the most items per request (a full batch is sent at once).
        on_run_gone: called once the API refuses a report because this run is no longer the
            trial's current run (default: log and end the process).
    """

    def __init__(
        self,
        session: Session,
        trial_id: int,
        allocation_id: str,
        *,
        flush_every: float = FLUSH_EVERY,
        max_batch: int = MAX_BATCH,
        on_run_gone: RunGoneHandler = exit_run_gone,
    ) -> None:
        self._session = session
        self._path = f"/trials/{trial_id}/reports"
        self._prefix = allocation_id
        self._flush_every = flush_every
        self._max_batch = max_batch
        self._on_run_gone = on_run_gone
        self.run_gone = False
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[float, dict[str, Any]]] = collections.deque()
        self._inflight = 0
        self._seq = 0
        self._flush_waiters = 0
        self._closing = False
        self._give_up = threading.Event()
        self.delivered = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="cairn-reporter", daemon=True)
        self._thread.start()
        atexit.register(self._atexit)

    def submit(self, item: dict[str, Any]) -> None:
        """Queues ``item`` with the next idempotency key; returns immediately."""
        with self._cond:
            if self._closing:
                log.warning("report after close() is dropped: %s", item.get("kind"))
                return
            self._seq += 1
            keyed = {**item, "idempotency_key": f"{self._prefix}:{self._seq}"}
            self._queue.append((time.monotonic(), keyed))
            # Wake the sender for the first item (it starts the flush_every clock) and for a
            # full batch; in between it is already waiting with a timeout.
            if len(self._queue) == 1 or len(self._queue) >= self._max_batch:
                self._cond.notify_all()

    def pending(self) -> int:
        """Items submitted but not yet delivered (or dropped)."""
        with self._cond:
            return len(self._queue) + self._inflight

    def flush(self, timeout: float | None = None) -> bool:
        """Sends what is queued now and waits until it is delivered (or ``timeout`` passes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flush_waiters += 1
            self._cond.notify_all()
            try:
                while self._queue or self._inflight:
                    if not self._thread.is_alive():
                        return False
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    self._cond.wait(0.1 if left is None else min(left, 0.1))
                return True
            finally:
                self._flush_waiters -= 1

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Flushes for at most ``timeout`` seconds, then stops the thread.

        Returns:
            True when every report was delivered.
        """
        atexit.unregister(self._atexit)
        done = self.flush(timeout)
        with self._cond:
            self._closing = True
            lost = len(self._queue) + self._inflight
            self._cond.notify_all()
        self._give_up.set()
        self._thread.join(5.0)
        if not done or lost or self.dropped:
            log.error(
                "cairn: %d report(s) could not be delivered (%d dropped as invalid)",
                lost,
                self.dropped,
            )
        return done and not self.dropped

    def _run_is_gone(self, exc: HTTPStatusError, items: int) -> None:
        """Nothing this run reports will be accepted again: drop what waits and stop."""
        with self._cond:
            self.run_gone = True
            self.dropped += items + len(self._queue)
            self._queue.clear()
            self._closing = True
            self._cond.notify_all()
        self._on_run_gone(error_message(exc))

    def _atexit(self) -> None:
        self.close(timeout=CLOSE_TIMEOUT)

    def _next_batch(self) -> list[dict[str, Any]] | None:
        with self._cond:
            while not self._queue or self._give_up.is_set():
                if self._closing:
                    return None
                self._cond.wait()
            while (
                len(self._queue) < self._max_batch and not self._flush_waiters and not self._closing
            ):
                left = self._queue[0][0] + self._flush_every - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = [
                self._queue.popleft()[1] for _ in range(min(len(self._queue), self._max_batch))
            ]
            self._inflight = len(batch)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._send(batch)
            finally:
                with self._cond:
                    self._inflight = 0
                    self._cond.notify_all()

    def _send(self, batch: list[dict[str, Any]]) -> None:
        attempt = 0
        while True:
            try:
                self._session.request("POST", self._path, {"items": batch}, timeout=30.0)
                self.delivered += len(batch)
                return
            except HTTPStatusError as exc:
                if is_run_gone(exc):
                    self._run_is_gone(exc, len(batch))
                    return
                if not exc.retryable:
                    if len(batch) > 1:  # find the bad item(s); keep the good ones
                        for item in batch:
                            self._send([item])
                        return
                    self.dropped += 1
                    log.error("cairn: report rejected (%s), dropped: %s", exc, batch[0])
                    return
                error: Exception = exc
            except (OSError, ValueError) as exc:  # unreachable, reset, timeout, bad JSON
                error = exc
            if self._give_up.is_set():
                return
            delay = min(0.1 * 2**attempt, 5.0)
            attempt += 1
            if attempt in (3, 10) or attempt % 50 == 0:
                log.warning("cairn: reporting failed (%s); retrying", error)
            self._give_up.wait(delay)
