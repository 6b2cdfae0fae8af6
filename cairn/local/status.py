"""What ``cairn status`` shows and what ``cairn up`` / ``down`` wait for: views of the state file.

Everything here only reads: the state file the supervisor writes (:mod:`cairn.local.state`) and
live pid checks. Passwords never leave it: the views mask them, the full URLs stay in the 0600
state file.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from cairn.local.state import (
    DEGRADED,
    FAILED,
    HEALTHY,
    RESTARTING,
    STARTING,
    STOPPED,
    ClusterState,
    ProcessState,
    pid_alive,
    read_state,
)
from events.log.redact import redact_url


def running_state(data_dir: Path) -> ClusterState | None:
    """The state of the cluster on ``data_dir`` if its supervisor is alive, else ``None``."""
    state = read_state(data_dir)
    if state is None or not state.supervisor_alive():
        return None
    return state


def process_view(rec: ProcessState, cluster_running: bool) -> dict[str, Any]:
    """One process as ``cairn status`` shows it: the record plus live checks.

    ``state`` is ``alive``, ``dead``, ``failed``, ``starting``, ``restarting`` or ``stopped``.
    """
    alive = rec.alive()
    if rec.state == FAILED:
        shown = FAILED
    elif cluster_running and rec.state in (STARTING, RESTARTING):
        shown = rec.state
    elif alive:
        shown = "alive"
    else:
        shown = "dead" if cluster_running else STOPPED
    uptime = time.time() - rec.started_at if alive and rec.started_at else None
    return {
        "name": rec.name,
        "kind": rec.kind,
        "pid": rec.pid,
        "state": shown,
        "alive": alive,
        "restarts": rec.restarts,
        "exit_code": rec.exit_code,
        "uptime_s": round(uptime, 1) if uptime is not None else None,
        "log": rec.log,
    }


def describe(data_dir: Path) -> dict[str, Any]:
    """The cluster on ``data_dir`` as ``cairn status --json`` prints it.

    Keys: ``data_dir``, ``running`` (its supervisor is alive), ``healthy`` (running and every
    process alive), ``status`` (as the supervisor recorded it, or ``none``), ``supervisor_pid``,
    ``dsn`` and ``nats_url`` (passwords masked: the full ones are in the 0600 state file),
    ``api_url``, ``ports``, ``slots``, ``error``, ``leftovers`` (processes
    alive although no supervisor runs) and ``processes`` (see :func:`process_view`).
    """
    state = read_state(data_dir)
    if state is None:
        return {
            "data_dir": str(data_dir),
            "running": False,
            "healthy": False,
            "status": "none",
            "processes": [],
            "leftovers": [],
        }
    running = state.supervisor_alive()
    procs = [process_view(rec, running) for rec in state.processes.values()]
    healthy = (
        running
        and state.status == HEALTHY
        and bool(procs)
        and all(p["state"] == "alive" for p in procs)
    )
    return {
        "data_dir": state.data_dir,
        "running": running,
        "healthy": healthy,
        "status": state.status if running or state.status == FAILED else STOPPED,
        "supervisor_pid": state.supervisor_pid,
        "dsn": redact_url(state.dsn),
        "nats_url": redact_url(state.nats_url),
        "api_url": state.api_url,
        "ports": state.ports,
        "slots": state.slots,
        "error": state.error,
        "started_at": state.started_at,
        "leftovers": [] if running else [p["name"] for p in procs if p["alive"]],
        "processes": procs,
    }


def wait_for_status(
    data_dir: Path,
    supervisor: subprocess.Popen[bytes] | None,
    pid: int,
    timeout: float,
) -> ClusterState | None:
    """Waits until the supervisor ``pid`` reports ``healthy`` or ``failed``, or goes away.

    Returns:
        Its last state (``None`` if it never wrote one); on timeout, whatever it last wrote.
    """
    deadline = time.monotonic() + timeout
    last: ClusterState | None = None
    while time.monotonic() < deadline:
        state = read_state(data_dir)
        if state is not None and state.supervisor_pid == pid:
            last = state
            if state.status in (HEALTHY, FAILED, STOPPED, DEGRADED):
                return state
        exited = supervisor.poll() is not None if supervisor is not None else not pid_alive(pid)
        if exited:
            state = read_state(data_dir)
            return state if state is not None and state.supervisor_pid == pid else last
        time.sleep(0.1)
    return last


def wait_for_exit(pid: int, create_time: float | None, timeout: float) -> bool:
    """Waits until process ``pid`` is gone; True if it went within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid, create_time):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
