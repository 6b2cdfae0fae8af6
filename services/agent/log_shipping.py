"""A run's output lines, shipped to ``POST /allocations/{id}/logs`` in batches (at most 500
lines or 1 s), each retried under its own idempotency key until the API takes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from datetime import UTC, datetime
from typing import Any

import structlog

from services.agent.client import ApiClient, ApiError

log = structlog.get_logger("agent")

LOG_BATCH_LINES = 500
LOG_BATCH_SECONDS = 1.0
LOG_BATCH_CHARS = 4 << 20
"""A batch is cut once its lines reach this many characters (the gateway refuses a batch body
over 32 MiB; one line is at most :data:`STREAM_LIMIT` bytes)."""
LOG_BUFFER_LINES = 20_000


class LogShipper:
    """Buffers a run's output lines and posts them in batches.

    A batch is cut when 500 lines wait or the oldest waiting line is 1 s old, and holds at most
    :data:`LOG_BATCH_CHARS` characters of text (or one line); a failed post is
    retried with the same idempotency key. The buffer is bounded: beyond it the oldest lines are
    dropped and a marker line says how many.

    Args:
        client: the API client.
        allocation_id: the run whose lines these are.
        key_prefix: prefix of the batches' idempotency keys (unique per agent process).
    """

    def __init__(
        self,
        client: ApiClient,
        allocation_id: str,
        key_prefix: str,
        *,
        max_lines: int = LOG_BATCH_LINES,
        max_wait: float = LOG_BATCH_SECONDS,
        max_buffer: int = LOG_BUFFER_LINES,
    ) -> None:
        self._client = client
        self._allocation_id = allocation_id
        self._key_prefix = key_prefix
        self._max_lines = max_lines
        self._max_wait = max_wait
        self._max_buffer = max_buffer
        self._buffer: collections.deque[tuple[float, dict[str, Any]]] = collections.deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._dropped = 0
        self._seq = 0
        self.shipped = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Starts the shipping task."""
        self._task = asyncio.create_task(self._run(), name=f"logs-{self._allocation_id}")

    def add(self, rank: int | None, stream: str, line: str) -> None:
        """Buffers one line (never blocks)."""
        entry = {
            "ts": datetime.now(UTC).isoformat(),
            "rank": rank,
            "stream": stream,
            "line": line,
        }
        self._buffer.append((time.monotonic(), entry))
        if len(self._buffer) > self._max_buffer:
            self._buffer.popleft()
            self._dropped += 1
        if len(self._buffer) == 1 or len(self._buffer) >= self._max_lines:
            self._wake.set()  # the first line starts the batch timer; a full batch goes at once

    async def close(self, timeout: float = 10.0) -> None:
        """Ships what is buffered (bounded by ``timeout``) and stops."""
        self._closing = True
        self._wake.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            log.warning(
                "log lines not shipped", allocation_id=self._allocation_id, lines=len(self._buffer)
            )

    async def _run(self) -> None:
        while True:
            if not self._buffer:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            age = time.monotonic() - self._buffer[0][0]
            if len(self._buffer) < self._max_lines and not self._closing and age < self._max_wait:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._max_wait - age)
                continue
            batch: list[dict[str, Any]] = []
            size = 0
            while self._buffer and len(batch) < self._max_lines:
                line_size = len(self._buffer[0][1]["line"])
                if batch and size + line_size > LOG_BATCH_CHARS:
                    break
                batch.append(self._buffer.popleft()[1])
                size += line_size
            if self._dropped:
                batch.insert(
                    0,
                    {
                        "ts": batch[0]["ts"],
                        "rank": None,
                        "stream": "stderr",
                        "line": f"[cairn-agent] {self._dropped} log line(s) dropped",
                    },
                )
                self._dropped = 0
            self._seq += 1
            await self._ship(batch, f"{self._key_prefix}:{self._seq}")

    async def _ship(self, batch: list[dict[str, Any]], key: str) -> None:
        while True:
            try:
                await self._client.logs(self._allocation_id, batch, key, retry_for=10.0)
                self.shipped += len(batch)
                return
            except ApiError as exc:
                if 400 <= exc.status < 500 and exc.status not in (408, 425, 429):
                    log.error(
                        "log batch rejected", allocation_id=self._allocation_id, error=str(exc)
                    )
                    return
                log.warning(
                    "log shipping failing", allocation_id=self._allocation_id, error=str(exc)
                )
            await asyncio.sleep(1.0)
