"""Stop signals: SIGTERM and SIGINT (and SIGHUP for a terminal) become a stop request.

The handler only calls the given ``stop`` (the supervisor's :meth:`request_stop`, which sets an
event); the stopping itself happens in the supervisor's loop, never in the handler.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any


@contextlib.contextmanager
def stop_signals(stop: Callable[[], None], *, hangup: bool = False) -> Iterator[None]:
    """Routes SIGTERM and SIGINT (and SIGHUP if asked) to ``stop`` while the block runs."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop()

    sigs = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGHUP] if hangup else [])
    previous: dict[int, Any] = {sig: signal.signal(sig, handler) for sig in sigs}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
