"""Preemption signal (mirrors ``det.core.PreemptContext``).

On a cluster a daemon thread long-polls
``GET /api/v1/allocations/{allocation_id}/signals/preemption?timeout_seconds=N`` and latches the
answer; :meth:`PreemptContext.should_preempt` only reads the latch, so calling it every batch is
cheap. Off-cluster it is always False. With several processes the :class:`PreemptMode` says which
ranks poll and which ask the chief. An answer saying the run is no longer current (it was declared
lost, or has exited) ends the process (:mod:`cairn.core._run_gone`).
"""

from __future__ import annotations

import enum
import logging
import signal
import threading
import time

from cairn.core._distributed import DistributedContext, DummyDistributedContext
from cairn.core._http import HTTPStatusError, Session
from cairn.core._run_gone import RunGoneHandler, error_message, exit_run_gone, is_run_gone
from events import settings

log = logging.getLogger("cairn.core")

POLL_SECONDS = 30


class PreemptMode(enum.Enum):
    """Which ranks call :meth:`PreemptContext.should_preempt` and where the answer comes from.

    Attributes:
        WorkersAskChief: every rank calls ``should_preempt()`` in step; only the chief watches
            the cluster's signal and broadcasts its answer, so all ranks stop at the same call.
        ChiefOnly: only the chief may call ``should_preempt()`` (it tells the workers itself).
        WorkersAskMaster: every rank watches the signal on its own; ranks may see it at
            slightly different calls.
    """

    WorkersAskChief = "WORKERS_ASK_CHIEF"
    ChiefOnly = "CHIEF_ONLY"
    WorkersAskMaster = "WORKERS_ASK_MASTER"


class PreemptContext:
    """Answers "should this trial checkpoint and exit now?".

    Args:
        session: the HTTP session, or ``None`` off-cluster (never preempted).
        allocation_id: the allocation whose signal is polled.
        mode: which ranks ask whom (see :class:`PreemptMode`).
        distributed: this process's rank (a single process when omitted).
        on_run_gone: called once the API says this run is no longer the trial's current run
            (default: log and end the process).
    """

    def __init__(
        self,
        session: Session | None,
        allocation_id: str,
        mode: PreemptMode = PreemptMode.WorkersAskChief,
        distributed: DistributedContext | None = None,
        on_run_gone: RunGoneHandler = exit_run_gone,
    ) -> None:
        self._session = session
        self._allocation_id = allocation_id
        self._path = f"/allocations/{allocation_id}/signals/preemption"
        self.mode = PreemptMode(mode)
        self._distributed = distributed or DummyDistributedContext()
        self._on_run_gone = on_run_gone
        self._flag = threading.Event()
        self._stop = threading.Event()
        self._acknowledged = False
        self._thread: threading.Thread | None = None

    @property
    def _watches(self) -> bool:
        """Whether this rank polls the cluster itself (the chief, or every rank in
        ``WorkersAskMaster``)."""
        return self._distributed.is_chief or self.mode is PreemptMode.WorkersAskMaster

    def start(self) -> None:
        """Starts the watcher thread (on-cluster only; idempotent).

        Under a resource manager that signals every process of a job when it stops it (Slurm:
        SIGTERM on ``scancel`` and at the time limit), the agent names those signals in
        ``CAIRN_PREEMPT_SIGNALS``; each then sets the preemption flag instead of ending the
        process, so the training loop checkpoints and exits as for any preemption.
        """
        if self._session is None or self._thread is not None:
            return
        self._catch_signals()
        if not self._watches:
            return
        self._thread = threading.Thread(target=self._watch, name="cairn-preempt", daemon=True)
        self._thread.start()

    def _catch_signals(self) -> None:
        names = settings.PREEMPT_SIGNALS.get() or ""
        if not names or threading.current_thread() is not threading.main_thread():
            return
        for name in names.split(","):
            number = getattr(signal, f"SIG{name.strip().upper()}", None)
            if isinstance(number, signal.Signals):
                signal.signal(number, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self._flag.is_set():
            log.warning("cairn: signal %d: checkpointing and exiting (preempted)", signum)
        self._flag.set()

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
                    if answer.get("current") is False:
                        self._on_run_gone(
                            f"allocation {self._allocation_id} has ended: the platform "
                            "declared it lost or recorded its exit"
                        )
                    return
                if time.monotonic() - started < 0.5:  # the server did not hold the poll
                    self._stop.wait(0.5)
                continue
            except HTTPStatusError as exc:
                if is_run_gone(exc):
                    self._flag.set()
                    self._on_run_gone(error_message(exc))
                    return
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

        In ``WorkersAskChief`` mode every rank must call this in step (the chief broadcasts its
        answer); in ``ChiefOnly`` mode only the chief may call it.

        Args:
            auto_ack: acknowledge the signal the first time it is seen.

        Raises:
            RuntimeError: a worker called it in ``ChiefOnly`` mode.
        """
        dist = self._distributed
        if self._watches:
            out = self._flag.is_set()
            if out and auto_ack and not self._acknowledged:
                self.acknowledge_preemption_signal()
            if self.mode is PreemptMode.WorkersAskChief and dist.size > 1:
                dist.broadcast(out)
            return out
        if self.mode is PreemptMode.ChiefOnly:
            raise RuntimeError(
                "should_preempt() was called on a worker (rank "
                f"{dist.rank}) but preempt_mode is ChiefOnly: only the chief may call it"
            )
        answer = dist.broadcast(None)
        out = bool(answer)
        if out and auto_ack and not self._acknowledged:
            self.acknowledge_preemption_signal()
        return out

    def acknowledge_preemption_signal(self) -> None:
        """Records that the trial will exit to be resumed later (the agent waits for the process
        to end; a preempted run counts as preempted whatever its exit status)."""
        if not self._acknowledged:
            log.info("cairn: preemption signal acknowledged")
        self._acknowledged = True

    @property
    def acknowledged(self) -> bool:
        """True after :meth:`acknowledge_preemption_signal`."""
        return self._acknowledged
