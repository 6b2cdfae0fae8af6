"""The output of an unmanaged run's script, shipped to the master as its run's log lines.

A managed trial's output is shipped by its agent; an unmanaged run has none, so its chief tees
``sys.stdout`` and ``sys.stderr``: everything is still written where it was, and each complete
line is also queued and posted in batches (``POST /allocations/{id}/logs``, one idempotency key
per batch) by a background thread. Shipping is best effort: a batch the master refuses is
dropped, and once the master says the run has ended nothing more is sent.
"""

from __future__ import annotations

import queue
import sys
import threading
import uuid
from datetime import UTC, datetime
from typing import Any, TextIO

from cairn.core._http import HTTPStatusError, Session

BATCH_LINES = 500
"""The most lines one request carries."""
SHIP_EVERY = 1.0
"""Seconds between batches."""
MAX_LINE = 64_000
"""Characters of one line kept (longer ones are cut)."""


class _Tee:
    """A text stream that writes through to ``target`` and queues each complete line."""

    def __init__(self, target: TextIO, stream: str, lines: queue.SimpleQueue[dict[str, Any]]):
        self._target = target
        self._stream = stream
        self._lines = lines
        self._partial = ""

    def write(self, text: str) -> int:
        written = self._target.write(text)
        self._partial += text
        *complete, self._partial = self._partial.split("\n")
        now = datetime.now(UTC).isoformat()
        for line in complete:
            self._lines.put({"ts": now, "stream": self._stream, "line": line[:MAX_LINE]})
        return written

    def flush(self) -> None:
        self._target.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


class LogShipper:
    """Tees this process's stdout and stderr to the run's logs on the master until stopped."""

    def __init__(self, session: Session, allocation_id: str, rank: int = 0) -> None:
        self._session = session
        self._path = f"/allocations/{allocation_id}/logs"
        self._rank = rank
        self._lines: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._gone = False
        self._key = uuid.uuid4().hex
        self._batches = 0
        self._thread = threading.Thread(target=self._run, name="cairn-log-shipper", daemon=True)
        self._streams: tuple[TextIO, TextIO] | None = None

    def start(self) -> None:
        """Starts teeing ``sys.stdout`` and ``sys.stderr``."""
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout = _Tee(sys.stdout, "stdout", self._lines)
        sys.stderr = _Tee(sys.stderr, "stderr", self._lines)
        self._thread.start()

    def stop(self) -> None:
        """Puts the streams back and ships what is queued (bounded by one request's timeout)."""
        if self._streams is not None:
            sys.stdout, sys.stderr = self._streams
            self._streams = None
        self._stopped.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stopped.wait(SHIP_EVERY):
            self._ship()
        while self._ship():
            pass

    def _ship(self) -> bool:
        """Posts one batch; returns whether there was one."""
        batch: list[dict[str, Any]] = []
        while len(batch) < BATCH_LINES:
            try:
                batch.append({**self._lines.get_nowait(), "rank": self._rank})
            except queue.Empty:
                break
        if not batch or self._gone:
            return False
        self._batches += 1
        body = {"lines": batch, "idempotency_key": f"{self._key}-{self._batches}"}
        try:
            self._session.request("POST", self._path, body, timeout=10)
        except HTTPStatusError as exc:
            self._gone = exc.status in (403, 404, 409)
        except OSError:
            pass  # unreachable for now: these lines are lost, later ones may get through
        return True
