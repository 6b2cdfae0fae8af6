"""The embedded cluster's run-state file, ``<data dir>/cluster.json``.

The supervisor is its only writer; ``cairn up``, ``cairn status`` and ``cairn down`` read it and
check the recorded process ids against the live process table. Writes are atomic (a temporary
file in the same directory, then ``os.replace``), so a reader never sees half a file. The file
holds the DSN and NATS URL with their passwords, so it is mode 0600.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import psutil

from cairn.local.private_files import write_private

STATE_FILE = "cluster.json"
FORMAT_VERSION = 1

# Cluster status values (``ClusterState.status``).
STARTING = "starting"
HEALTHY = "healthy"
DEGRADED = "degraded"
STOPPING = "stopping"
STOPPED = "stopped"
FAILED = "failed"

# Process state values (``ProcessState.state``).
RUNNING = "running"
RESTARTING = "restarting"


@dataclass
class ProcessState:
    """One supervised process (a server or a service) as last recorded by the supervisor.

    Attributes:
        name: ``postgres``, ``nats`` or the service name.
        kind: ``server`` or ``service``.
        pid: its current (or last) process id; ``None`` before the first start.
        create_time: the process's start time as the OS reports it, to tell a live pid from a
            recycled one.
        state: ``starting``, ``running``, ``restarting``, ``failed`` or ``stopped``.
        restarts: how many times the supervisor restarted it.
        exit_code: the exit status of its last death (negative: killed by that signal).
        last_exit_at: when it last died (Unix time).
        started_at: when its current incarnation started (Unix time).
        log: its log file.
        command: its command line.
    """

    name: str
    kind: str
    pid: int | None = None
    create_time: float | None = None
    state: str = STARTING
    restarts: int = 0
    exit_code: int | None = None
    last_exit_at: float | None = None
    started_at: float | None = None
    log: str = ""
    command: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        """True if the recorded process is running now (and is the same process)."""
        return pid_alive(self.pid, self.create_time)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessState:
        """Builds a record from its JSON form, ignoring unknown keys."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class ClusterState:
    """The whole cluster as last recorded by its supervisor.

    Attributes:
        data_dir: the cluster's data directory (absolute).
        status: ``starting``, ``healthy``, ``degraded``, ``stopping``, ``stopped`` or ``failed``.
        supervisor_pid: the process that owns every other process.
        supervisor_create_time: its OS start time (guards against pid reuse).
        dsn: PostgreSQL DSN of the ``cairn`` database, with its password.
        nats_url: the NATS URL, with its password.
        api_url: the API gateway's URL.
        ports: ``postgres``, ``nats`` and ``api`` TCP ports on 127.0.0.1, and
            ``<process>-metrics``: where each other service and agent serves ``/metrics``,
            ``/healthz`` and ``/readyz`` (loopback only).
        slots: the artificial slot count given to the agent, if any.
        error: why start-up failed (status ``failed``).
        started_at: when the supervisor started (Unix time).
        updated_at: when this record was written (Unix time).
        processes: per-process records, servers first, in start order.
    """

    data_dir: str
    status: str = STARTING
    supervisor_pid: int | None = None
    supervisor_create_time: float | None = None
    dsn: str = ""
    nats_url: str = ""
    api_url: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    slots: int | None = None
    error: str | None = None
    started_at: float | None = None
    updated_at: float | None = None
    processes: dict[str, ProcessState] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def supervisor_alive(self) -> bool:
        """True if the recorded supervisor is running now."""
        return pid_alive(self.supervisor_pid, self.supervisor_create_time)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form written to ``cluster.json``."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterState:
        """Builds a record from its JSON form, ignoring unknown keys."""
        known = {f.name for f in fields(cls)} - {"processes"}
        state = cls(**{k: v for k, v in data.items() if k in known})
        state.processes = {
            name: ProcessState.from_dict(proc)
            for name, proc in (data.get("processes") or {}).items()
        }
        return state


LAST_CLUSTER = Path("~/.cairn/last-cluster")
"""Where ``cairn up`` notes the data directory of the cluster it started, so that the CLI finds
that cluster from any working directory."""


def remember_cluster(data_dir: Path) -> None:
    """Notes ``data_dir`` as the user's most recently started cluster."""
    path = LAST_CLUSTER.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, f"{data_dir.resolve()}\n")


def remembered_cluster() -> Path | None:
    """The data directory of the user's most recently started cluster, if it still has a state
    file (``None`` otherwise)."""
    try:
        text = LAST_CLUSTER.expanduser().read_text().strip()
    except OSError:
        return None
    data_dir = Path(text)
    return data_dir if text and data_dir.is_absolute() and state_path(data_dir).exists() else None


def state_path(data_dir: Path) -> Path:
    """Where the state file of the cluster on ``data_dir`` lives."""
    return data_dir / STATE_FILE


def read_state(data_dir: Path) -> ClusterState | None:
    """Reads the state file; ``None`` if there is none (or it is unreadable)."""
    try:
        data = json.loads(state_path(data_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return ClusterState.from_dict(data)
    except TypeError:
        return None


def write_state(data_dir: Path, state: ClusterState) -> None:
    """Writes the state file atomically with mode 0600, stamping ``updated_at``."""
    state.updated_at = time.time()
    write_private(state_path(data_dir), json.dumps(state.to_dict(), indent=2) + "\n")


def process_create_time(pid: int) -> float | None:
    """The OS start time of ``pid``, or ``None`` if there is no such process."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def pid_alive(pid: int | None, create_time: float | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, when given, started at ``create_time``."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(proc.create_time() - create_time) > 0.5:
            return False
    except (psutil.Error, OSError):
        return False
    return True
