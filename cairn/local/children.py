"""A supervised process: its record in the state file, its live handle and its restart budget.

A child that dies is restarted after a backoff that doubles from :data:`BACKOFF_FIRST` up to
:data:`BACKOFF_MAX` seconds; one that died :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW`
seconds is left down (the supervisor marks it ``failed``).
"""

from __future__ import annotations

import collections
import subprocess
import time
from pathlib import Path

from cairn.local.servers import ServerProcess
from cairn.local.state import ProcessState, process_create_time

MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 10.0


class Child:
    """A supervised process: its record in the state file plus the live handle.

    Attributes:
        record: its record in the state file (updated in place).
        proc: a service's process (``None`` for a server or before the first start).
        server: a server's handle (``None`` for a service).
        ready_file: the file a service creates once it is ready (``None`` for a server).
        restart_at: when (monotonic) a restart is due.
        crashes: when (monotonic) it died within the last :data:`RESTART_WINDOW` seconds.
    """

    def __init__(self, record: ProcessState) -> None:
        self.record = record
        self.proc: subprocess.Popen[bytes] | None = None
        self.server: ServerProcess | None = None
        self.ready_file: Path | None = None
        self.restart_at = 0.0
        self.crashes: collections.deque[float] = collections.deque()

    @property
    def popen(self) -> subprocess.Popen[bytes] | None:
        """The live process, a server's or a service's (``None`` before it started)."""
        return self.server.proc if self.server is not None else self.proc

    def poll(self) -> int | None:
        """The exit status if the process has exited, else ``None``."""
        popen = self.popen
        return None if popen is None else popen.poll()

    def started(self, popen: subprocess.Popen[bytes]) -> None:
        """Records a (re)start of the process as ``popen``: its pid, start time and command."""
        rec = self.record
        rec.pid = popen.pid
        rec.create_time = process_create_time(popen.pid)
        rec.started_at = time.time()
        rec.command = [str(a) for a in popen.args] if isinstance(popen.args, list) else []

    def crashed(self, now: float) -> float | None:
        """Counts a death at ``now`` (monotonic) against the restart budget.

        Returns:
            The backoff in seconds before the restart (due at :attr:`restart_at`), or ``None``
            when it already died :data:`MAX_RESTARTS` times within :data:`RESTART_WINDOW` seconds
            and must stay down.
        """
        while self.crashes and now - self.crashes[0] > RESTART_WINDOW:
            self.crashes.popleft()
        if len(self.crashes) >= MAX_RESTARTS:
            return None
        self.crashes.append(now)
        delay: float = min(BACKOFF_FIRST * 2 ** (len(self.crashes) - 1), BACKOFF_MAX)
        self.restart_at = now + delay
        return delay
