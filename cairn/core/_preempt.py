"""Preemption signal (mirrors ``det.core.PreemptContext``).

On a cluster a daemon thread long-polls
``GET /api/v1/allocations/{allocation_id}/signals/preemption?timeout_seconds=N`` and latches the
answer; :meth:`PreemptContext.should_preempt` only reads the latch, so calling it every batch is
free. Off-cluster it is always False.
"""

from __future__ import annotations

import enum
import logging
import threading
import time

from cairn.core._http import HTTPStatusError, Session

log = logging.getLogger("cairn.core")

POLL_SECONDS = 30


class PreemptMode(enum.Enum):
    """How ranks learn about preemption.

    Every rank of a cairn run may poll the API itself, so all three modes behave like
    ``WorkersAskMaster``; the names exist so Determined code ports unchanged.
    """

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Answers "should this trial checkpoint and exit now?".

    Args:
        session: the HTTP session, or ``None`` off-cluster (never preempted).
        allocation_id: the allocation whose signal is polled.
        mode: accepted for compatibility (see :class:`PreemptMode`).
    """

    def __init__(
        self,
        session: Session | None,
        allocation_id: str,
        mode: PreemptMode = PreemptMode.WorkersAskChief,
    ) -> None:
        self._session = session
        self._path = f"/allocations/{allocation_id}/signals/preemption"
        self.mode = mode
        self._flag = threading.Event()
        self._stop = threading.Event()
        self._acknowledged = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Starts the watcher thread (on-cluster only; idempotent)."""
        if self._session is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="cairn-preempt", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops the watcher (it is a daemon; an in-flight poll is abandoned)."""
        self._stop.set()

    def _watch(self) -> None:
        assert self._session is not None
        attempt = 0
        while not self._stop.is_set() and not self._flag.is_set():
            started = time.monotonic()
            try:
                answer = self._session.request(
                    "GET",
                    f"{self._path}?timeout_seconds={POLL_SECONDS}",
                    timeout=POLL_SECONDS + 15,
                )
                attempt = 0
                if isinstance(answer, dict) and answer.get("preempt"):
                    self._flag.set()
                    return
                if time.monotonic() - started < 0.5:  # the server did not hold the poll
                    self._stop.wait(0.5)
                continue
            except HTTPStatusError as exc:
                if exc.status in (401, 403, 404):
                    log.warning("cairn: preemption signal unavailable (%s)", exc)
                error: Exception = exc
            except (OSError, ValueError) as exc:
                error = exc
            attempt += 1
            if attempt in (3, 10):
                log.warning("cairn: preemption poll failed (%s); retrying", error)
            self._stop.wait(min(0.2 * 2**attempt, 10.0))

    def should_preempt(self, auto_ack: bool = True) -> bool:
        """True once the cluster asked this trial to stop (checkpoint, then exit 0).

        Args:
            auto_ack: acknowledge the signal when it is seen.
        """
        if self._flag.is_set():
            if auto_ack:
                self.acknowledge_preemption_signal()
            return True
        return False

    def acknowledge_preemption_signal(self) -> None:
        """Records that the trial will exit (the agent waits for the process to end)."""
        self._acknowledged = True

    @property
    def acknowledged(self) -> bool:
        """True after :meth:`acknowledge_preemption_signal`."""
        return self._acknowledged
