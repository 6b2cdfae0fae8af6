"""Stopping a cluster's processes, agents first.

The order is the rule: agents, then the other services, then nats-server, then PostgreSQL (see
:meth:`cairn.local.supervisor.Supervisor._stop_all` for why the agents go first). Each group gets a
timeout after its signal; what is still alive after it is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import structlog

from cairn.local.options import STOP_TIMEOUT
from cairn.local.state import ClusterState
from cairn.local.topology import service_of

log = structlog.get_logger("supervisor")


def terminate(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """SIGTERMs ``procs``, waits up to ``timeout`` for all, then SIGKILLs the stragglers' groups."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("service did not stop; killing it", pid=proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(10)


def reap_leftovers(state: ClusterState, timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stops processes a dead supervisor left behind (agents first, as ``down`` does, then the
    other services, PostgreSQL last).

    Args:
        state: the dead supervisor's last record.
        timeout: seconds to wait for each group before SIGKILL.

    Returns:
        The names of the processes that were still running.
    """
    alive = [p for p in state.processes.values() if p.alive()]
    groups = [
        [p for p in alive if p.kind == "service" and service_of(p.name) == "agent"],
        [p for p in alive if p.kind == "service" and service_of(p.name) != "agent"],
        [p for p in alive if p.name == "nats"],
        [p for p in alive if p.name == "postgres"],
    ]
    for group in groups:
        for rec in group:
            sig = signal.SIGINT if rec.kind == "server" else signal.SIGTERM
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid or 0, sig)
        deadline = time.monotonic() + timeout
        for rec in group:
            while rec.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if rec.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(rec.pid or 0, signal.SIGKILL)
    return [p.name for p in alive]
