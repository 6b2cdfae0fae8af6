"""The embedded cluster: launcher and supervisor behind ``cairn up`` / ``status`` / ``down``.

One supervisor process owns everything on a data directory: a real PostgreSQL (``DIR/pg``), a
nats-server with JetStream (``DIR/nats``) and one process per service (``python -m
services.<name>``). Only the supervisor holds the PostgreSQL superuser's credential: before the
services start it applies every migration and makes each service's role with only its rights
(``python -m services.migrate``), and each service gets its own credentials in files of its own
(see :mod:`cairn.local.service_credentials`), never in its environment. The supervisor and every
service make themselves undumpable. It records pids, ports and per-process state
in ``DIR/cluster.json`` (see :mod:`cairn.local.state`), restarts what dies with backoff (at most
:data:`MAX_RESTARTS` in :data:`RESTART_WINDOW` seconds, then the process is marked ``failed``) and
stops everything in order on SIGTERM/SIGINT: agents, then the other services, then nats-server,
then PostgreSQL (see :meth:`Supervisor._stop_all` for why the agents go first).

In the default (background) mode ``cairn up`` spawns ``python -m cairn.local.cluster supervise``
detached and waits until the state file says ``healthy``; with ``--foreground`` the same loop runs
in the CLI process. The Postgres data directory survives ``down``/``up``, and so does the log.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import structlog

from cairn.errors import CairnError
from cairn.local import service_credentials
from cairn.local.private_files import read_or_create_secret
from cairn.local.servers import (
    ServerProcess,
    ServerStartError,
    bare_nats_url,
    free_port,
    nats_authority_file,
    nats_url_as,
    start_nats,
    start_postgres,
)
from cairn.local.state import (
    DEGRADED,
    FAILED,
    HEALTHY,
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    ClusterState,
    ProcessState,
    pid_alive,
    process_create_time,
    read_state,
    remembered_cluster,
    state_path,
    write_state,
)
from events import settings
from events.domain.config.cluster import (
    CLUSTER_CONFIG_FILE,
    ClusterConfigError,
    load_cluster_config,
)
from events.log.bus_auth import USER_ROLES
from events.log.redact import redact_url
from services import credentials

SERVICES: tuple[str, ...] = ("relay", "api", "searcher", "scheduler", "tracker", "agent")
"""Services started by ``cairn up``, in start order (each is ``python -m services.<name>``)."""
DECIDERS: tuple[str, ...] = ("relay", "searcher", "scheduler")
"""Services that lead by lease; ``--replicas N`` runs N of each (``searcher``, ``searcher-2``, ...)."""

DATABASE = "cairn"
DEFAULT_API_PORT = 8080
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 10.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.2

_REPO_ROOT = Path(__file__).resolve().parents[2]

log = structlog.get_logger("supervisor")


class ClusterStartError(CairnError):
    """The embedded cluster did not come up (the message says which part and why)."""


class _Interrupted(ClusterStartError):
    """A stop was requested while the cluster was starting."""


@dataclass
class ClusterOptions:
    """What ``cairn up`` was asked for.

    Attributes:
        data_dir: the cluster's data directory (made absolute).
        slots: artificial CPU slots for the agent; ``None`` lets the agent discover GPUs.
        api_port: preferred API port; a free one if it is taken, any free one when 0.
        timeout: seconds for the whole start-up (servers, database, every service ready).
        stop_timeout: seconds a service gets to exit after SIGTERM before it is SIGKILLed.
        replicas: replicas of each decider (:data:`DECIDERS`); all but the lease holder stand by.
        agents: how many agents to start (``agent``, ``agent-2``, ...), each with ``slots``.
    """

    data_dir: Path
    slots: int | None = None
    api_port: int = DEFAULT_API_PORT
    timeout: float = 60.0
    stop_timeout: float = STOP_TIMEOUT
    replicas: int = 1
    agents: int = 1


def replica_names(name: str, replicas: int) -> list[str]:
    """The process names of service ``name``'s replicas: ``name``, then ``name-2``, ``name-3``..."""
    count = replicas if name in DECIDERS else 1
    return [name] + [f"{name}-{n}" for n in range(2, count + 1)]


def service_of(process: str) -> str:
    """The service a process name runs (``searcher-2`` runs ``searcher``, ``agent-2`` the agent)."""
    base, _, number = process.rpartition("-")
    return base if base in (*DECIDERS, "agent") and number.isdigit() else process


def service_names(agents: int) -> list[str]:
    """The services ``cairn up`` starts: :data:`SERVICES`, the agent as ``agent``, ``agent-2``..."""
    extra = [f"agent-{n}" for n in range(2, max(agents, 1) + 1)]
    return [*SERVICES, *extra]


DEFAULT_DIR_NAME = ".cairn"


def default_data_dir() -> Path:
    """``$CAIRN_HOME``; else ``./.cairn`` if a cluster was started there; else the cluster the
    user started last (wherever that was), if its data directory is still there; else
    ``./.cairn``. Absolute."""
    home = settings.cairn_home()
    if home is not None:
        return home
    here = Path(DEFAULT_DIR_NAME).resolve()
    if state_path(here).exists():
        return here
    return remembered_cluster() or here


def logs_dir(data_dir: Path) -> Path:
    """Where service and supervisor logs go."""
    return data_dir / "logs"


def run_dir(data_dir: Path) -> Path:
    """Where readiness files go."""
    return data_dir / "run"


def supervisor_log(data_dir: Path) -> Path:
    """The supervisor's own log (restarts and failures are reported here)."""
    return logs_dir(data_dir) / "supervisor.log"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: ours, plus the repo root on ``PYTHONPATH`` in a checkout."""
    env = dict(os.environ)
    if (_REPO_ROOT / "services" / "runtime.py").is_file():
        parts = [str(_REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env.update(extra or {})
    return env


def cluster_config_path(data_dir: Path) -> Path:
    """The embedded cluster's config file (:mod:`events.domain.config.cluster`): ``DIR/cluster.yaml``.

    Every service gets its path (``CAIRN_CLUSTER_CONFIG``) when it exists; without it every
    setting has its default (checkpoints only under ``DIR/checkpoints``).
    """
    return data_dir / CLUSTER_CONFIG_FILE


def join_token_file(data_dir: Path) -> Path:
    """The cluster's join token (``DIR/join.token``, mode 0600), created on first use: agents
    present it once for their own credential. Its path, never its value, reaches the API and
    the agents."""
    path = data_dir / "join.token"
    read_or_create_secret(path)
    return path


def service_nats_env(name: str, nats_url: str, data_dir: Path) -> dict[str, str]:
    """The bus settings of process ``name``: each service its own NATS user (a path in the
    URL); an agent the bare URL and the join token file (it joins for its own user); the API
    also the authority file, to issue agents' users."""
    service = service_of(name)
    if service == "agent":
        return {
            "CAIRN_NATS": bare_nats_url(nats_url),
            "CAIRN_JOIN_TOKEN_FILE": str(join_token_file(data_dir)),
        }
    env = {"CAIRN_NATS": nats_url_as(nats_url, service if service in USER_ROLES else "admin")}
    if service == "api":
        env["CAIRN_JOIN_TOKEN_FILE"] = str(join_token_file(data_dir))
        authority = nats_authority_file(nats_url)
        if authority is not None:
            env["CAIRN_NATS_AUTHORITY_FILE"] = str(authority)
    return env


def tail(path: Path | str, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" if it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.splitlines()) or "    (empty log)"


# --------------------------------------------------------------------------- supervised children


class _Child:
    """A supervised process: its record in the state file plus the live handle."""

    def __init__(self, record: ProcessState) -> None:
        self.record = record
        self.proc: subprocess.Popen[bytes] | None = None
        self.server: ServerProcess | None = None
        self.ready_file: Path | None = None
        self.restart_at = 0.0
        self.crashes: collections.deque[float] = collections.deque()

    @property
    def popen(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc if self.server is not None else self.proc

    def poll(self) -> int | None:
        """The exit status if the process has exited, else ``None``."""
        popen = self.popen
        return None if popen is None else popen.poll()

    def started(self, popen: subprocess.Popen[bytes]) -> None:
        rec = self.record
        rec.pid = popen.pid
        rec.create_time = process_create_time(popen.pid)
        rec.started_at = time.time()
        rec.command = [str(a) for a in popen.args] if isinstance(popen.args, list) else []


class Supervisor:
    """Starts, watches and stops the servers and services of one embedded cluster.

    Args:
        options: what to start and where.
        notify: called with a one-line, human-readable message for each notable event (used by
            ``--foreground`` to echo restarts on the terminal); everything is also logged.
    """

    def __init__(self, options: ClusterOptions, notify: Callable[[str], None] | None = None):
        self.options = options
        self.data_dir = options.data_dir
        self.notify = notify or (lambda _msg: None)
        self.state = ClusterState(data_dir=str(self.data_dir), slots=options.slots)
        self.children: dict[str, _Child] = {}
        self._stop = threading.Event()
        self._deadline = 0.0

    # -- control

    def request_stop(self) -> None:
        """Asks the supervisor to stop everything (safe to call from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """True once a stop has been requested."""
        return self._stop.is_set()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise _Interrupted("start-up interrupted by a stop request")

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise ClusterStartError(f"start-up timed out after {self.options.timeout:.0f}s")
        return left

    def _save(self) -> None:
        write_state(self.data_dir, self.state)

    # -- start-up

    def start(self) -> None:
        """Starts servers and services and waits until every service is ready.

        Raises:
            ClusterStartError: something did not come up in time (everything started so far has
                been stopped again and the state file says ``failed`` with the reason).
        """
        self._deadline = time.monotonic() + self.options.timeout
        previous = read_state(self.data_dir)
        if previous is not None:
            left = reap_leftovers(previous)
            if left:
                log.warning("stopped processes a dead supervisor left behind", names=left)
        logs_dir(self.data_dir).mkdir(parents=True, exist_ok=True)
        run_dir(self.data_dir).mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        self.state.supervisor_pid = pid
        self.state.supervisor_create_time = process_create_time(pid)
        self.state.started_at = time.time()
        self.state.status = STARTING
        self._save()
        log.info("cluster starting", data_dir=str(self.data_dir), slots=self.options.slots)
        try:
            self._check_cluster_config()
            self._start_servers()
            self._check_stop()
            self._prepare_database()
            self._check_stop()
            self._start_services()
            self._wait_ready()
        except BaseException as exc:
            self.state.error = str(exc) if isinstance(exc, CairnError) else repr(exc)
            interrupted = isinstance(exc, _Interrupted)
            log.error("cluster start failed", error=self.state.error)
            self._stop_all()
            self.state.status = STOPPED if interrupted else FAILED
            self._save()
            if isinstance(exc, ClusterStartError):
                raise
            if isinstance(exc, Exception):
                raise ClusterStartError(self.state.error) from exc
            raise
        self.state.status = HEALTHY
        self._save()
        log.info(
            "cluster healthy",
            dsn=redact_url(self.state.dsn),
            nats=redact_url(self.state.nats_url),
        )

    def _check_cluster_config(self) -> None:
        """Refuses to start with a cluster config that a service would refuse."""
        path = cluster_config_path(self.data_dir)
        if not path.exists():
            return
        try:
            load_cluster_config(path)
        except ClusterConfigError as exc:
            raise ClusterStartError(f"invalid cluster config:\n{_indent(str(exc))}") from exc

    def _add(self, record: ProcessState) -> _Child:
        child = _Child(record)
        self.children[record.name] = child
        self.state.processes[record.name] = record
        return child

    def _start_servers(self) -> None:
        pg = self._add(ProcessState(name="postgres", kind="server"))
        try:
            pg.server = start_postgres(self.data_dir / "pg", timeout=self._remaining())
        except ServerStartError as exc:
            raise ClusterStartError(
                f"postgres did not start: {exc}\n{_indent(tail(self.data_dir / 'pg.log'))}"
            ) from exc
        self._server_started(pg)
        self._check_stop()
        nats = self._add(ProcessState(name="nats", kind="server"))
        try:
            nats.server = start_nats(self.data_dir / "nats", timeout=min(30.0, self._remaining()))
        except ServerStartError as exc:
            raise ClusterStartError(
                f"nats did not start: {exc}\n{_indent(tail(self.data_dir / 'nats.log'))}"
            ) from exc
        self._server_started(nats)
        assert pg.server is not None
        base = pg.server.url.rsplit("/", 1)[0]
        self.state.dsn = f"{base}/{DATABASE}"
        self.state.nats_url = nats.server.url
        self.state.ports.update(postgres=pg.server.port, nats=nats.server.port)
        self._save()

    def _server_started(self, child: _Child) -> None:
        assert child.server is not None
        child.started(child.server.proc)
        child.record.log = str(child.server.log_path)
        child.record.state = RUNNING
        log.info("server started", name=child.record.name, pid=child.record.pid)

    def _prepare_database(self) -> None:
        pg = self.children["postgres"].server
        assert pg is not None
        try:
            asyncio.run(asyncio.wait_for(_ensure_database(pg.url), self._remaining()))
        except Exception as exc:  # asyncpg, events and timeout errors alike
            raise ClusterStartError(f"could not prepare database {DATABASE!r}: {exc}") from exc
        try:
            service_credentials.grant_roles(
                self.state.dsn,
                service_credentials.secrets_dir(self.data_dir),
                env=child_env(),
                timeout=self._remaining(),
            )
        except service_credentials.CredentialsHandoverError as exc:
            raise ClusterStartError(str(exc)) from exc

    def _start_services(self) -> None:
        port = self.options.api_port
        if port == 0 or not _port_free(port):
            port = free_port()
        self.state.ports["api"] = port
        self.state.api_url = f"http://127.0.0.1:{port}"
        service_credentials.ensure_admin_password(self.data_dir, settings.ADMIN_PASSWORD.get())
        for service in service_names(self.options.agents):
            for name in replica_names(service, self.options.replicas):
                log_path = logs_dir(self.data_dir) / f"{name}.log"
                child = self._add(ProcessState(name=name, kind="service", log=str(log_path)))
                child.ready_file = run_dir(self.data_dir) / f"{name}.ready"
                self._spawn(child)
        self._save()

    def service_command(self, name: str) -> list[str]:
        """The command line of service ``name``.

        It holds no secret: any local user can read a command line. The service finds its
        credentials in the files :meth:`_spawn` names in its environment.
        """
        agent = service_of(name) == "agent"
        cmd = [sys.executable, "-m", f"services.{service_of(name)}"]
        if name == "api":
            cmd += ["--port", str(self.state.ports["api"])]
        if agent:
            if self.options.slots is not None:
                cmd += ["--artificial-slots", str(self.options.slots)]
            cmd += ["--api-url", self.state.api_url]
        if name.startswith("agent-"):  # a further agent on this machine: its own id and files
            suffix = name.removeprefix("agent-")
            cmd += ["--agent-id", f"{socket.gethostname()}-{suffix}"]
            cmd += ["--work-dir", str(self.data_dir / name)]
        return cmd

    def _spawn(self, child: _Child) -> None:
        name = child.record.name
        assert child.ready_file is not None
        with contextlib.suppress(FileNotFoundError):
            child.ready_file.unlink()
        bus = service_nats_env(name, self.state.nats_url, self.data_dir)
        files = service_credentials.service_files(
            service_credentials.secrets_dir(self.data_dir),
            service_of(name),
            nats_url=bus.pop("CAIRN_NATS"),
            admin_password=self.data_dir / service_credentials.ADMIN_PASSWORD_FILE,
        )
        config_file = cluster_config_path(self.data_dir)
        env = service_credentials.service_env(
            child_env(
                {
                    "CAIRN_READY_FILE": str(child.ready_file),
                    "CAIRN_API_URL": self.state.api_url,
                    "CAIRN_HOME": str(self.data_dir),
                    "CAIRN_AGENT_WORK_DIR": str(self.data_dir / "agent"),
                    "CAIRN_CLUSTER_CONFIG": str(config_file) if config_file.exists() else "",
                    **bus,
                }
            ),
            files,
        )
        with open(child.record.log, "ab") as out:
            child.proc = subprocess.Popen(
                self.service_command(name),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.data_dir,
                start_new_session=True,
            )
        child.started(child.proc)
        child.record.state = STARTING
        log.info("service started", name=name, pid=child.proc.pid)

    def _wait_ready(self) -> None:
        services = [c for c in self.children.values() if c.record.kind == "service"]
        while True:
            self._check_stop()
            for child in self.children.values():
                code = child.poll()
                if code is not None:
                    raise ClusterStartError(
                        f"{child.record.name} exited with status {code} during start-up; "
                        f"last lines of {child.record.log}:\n{_indent(tail(child.record.log))}"
                    )
            pending = []
            for child in services:
                assert child.ready_file is not None
                if child.ready_file.exists():
                    if child.record.state != RUNNING:
                        child.record.state = RUNNING
                        log.info("service ready", name=child.record.name, pid=child.record.pid)
                else:
                    pending.append(child)
            if not pending:
                return
            if time.monotonic() > self._deadline:
                details = "\n".join(
                    f"  {c.record.name} (log {c.record.log}):\n{_indent(tail(c.record.log))}"
                    for c in pending
                )
                names = ", ".join(c.record.name for c in pending)
                raise ClusterStartError(
                    f"not ready after {self.options.timeout:.0f}s: {names}\n{details}"
                )
            self._stop.wait(0.05)

    # -- watching

    def run(self) -> None:
        """Watches the children until a stop is requested, then stops everything."""
        try:
            while not self._stop.is_set():
                self.tick()
                self._stop.wait(POLL_INTERVAL)
        finally:
            self.shutdown()

    def tick(self) -> None:
        """One pass of the watch loop: notices deaths, restarts due processes, marks readiness."""
        changed = False
        for child in self.children.values():
            rec = child.record
            if rec.state in (FAILED, STOPPED):
                continue
            if rec.state == RESTARTING:
                if time.monotonic() >= child.restart_at:
                    self._restart(child)
                    changed = True
                continue
            code = child.poll()
            if code is not None:
                self._on_exit(child, code)
                changed = True
            elif (
                rec.state == STARTING and child.ready_file is not None and child.ready_file.exists()
            ):
                rec.state = RUNNING
                log.info("service ready", name=rec.name, pid=rec.pid, restarts=rec.restarts)
                self.notify(f"{rec.name} is back (pid {rec.pid}, restart {rec.restarts})")
                changed = True
        if changed:
            self._update_status()

    def _update_status(self) -> None:
        if self.state.status in (HEALTHY, DEGRADED):
            ok = all(c.record.state == RUNNING for c in self.children.values())
            new = HEALTHY if ok else DEGRADED
            if new != self.state.status:
                log.info("cluster status", status=new)
            self.state.status = new
        self._save()

    def _on_exit(self, child: _Child, code: int) -> None:
        rec = child.record
        now = time.monotonic()
        rec.exit_code = code
        rec.last_exit_at = time.time()
        while child.crashes and now - child.crashes[0] > RESTART_WINDOW:
            child.crashes.popleft()
        if len(child.crashes) >= MAX_RESTARTS:
            rec.state = FAILED
            log.error(
                "process failed: too many restarts, leaving it down",
                name=rec.name,
                pid=rec.pid,
                exit_code=code,
                restarts=rec.restarts,
                window_s=RESTART_WINDOW,
                log_path=rec.log,
            )
            self.notify(f"{rec.name} died (status {code}) too often; marked failed, see {rec.log}")
            return
        child.crashes.append(now)
        delay = min(BACKOFF_FIRST * 2 ** (len(child.crashes) - 1), BACKOFF_MAX)
        child.restart_at = now + delay
        rec.state = RESTARTING
        log.warning(
            "process died; restarting",
            name=rec.name,
            pid=rec.pid,
            exit_code=code,
            restarts=rec.restarts,
            backoff_s=delay,
            log_path=rec.log,
        )
        self.notify(f"{rec.name} (pid {rec.pid}) died with status {code}; restarting in {delay}s")

    def _restart(self, child: _Child) -> None:
        rec = child.record
        rec.restarts += 1
        try:
            if rec.kind == "server":
                self._restart_server(child)
            else:
                self._spawn(child)
        except (ServerStartError, OSError) as exc:
            log.error("restart failed", name=rec.name, error=str(exc))
            self._on_exit(child, -1)

    def _restart_server(self, child: _Child) -> None:
        old = child.server
        assert old is not None
        if child.record.name == "postgres":
            child.server = start_postgres(old.data_dir, port=old.port, timeout=30.0)
        else:
            child.server = start_nats(old.data_dir, port=old.port, timeout=30.0)
        self._server_started(child)
        self.notify(f"{child.record.name} is back (pid {child.record.pid})")

    # -- stopping

    def shutdown(self) -> None:
        """Stops agents, then the other services (SIGTERM, then SIGKILL), then nats-server, then
        PostgreSQL."""
        if self.state.status == STOPPED:
            return
        self.state.status = STOPPING
        self._save()
        log.info("cluster stopping")
        self._stop_all()
        self.state.status = STOPPED
        self._save()
        log.info("cluster stopped")

    def _stop_all(self) -> None:
        """Agents first, while the API and the scheduler still run: each agent records that it
        is leaving, then stops its runs and reports their exits to an API that takes them, so
        the log says at once how each run ended (its exit code, after its last checkpoint) and
        the scheduler restarts it without placing the restart on the leaving agent (protocol.md,
        "One end per run"). Stopped together instead, the API may be gone before the reports:
        they wait on disk for the next ``up``."""
        services = [c for c in self.children.values() if c.record.kind == "service"]
        agents = [c.proc for c in services if service_of(c.record.name) == "agent"]
        others = [c.proc for c in services if service_of(c.record.name) != "agent"]
        terminate([p for p in agents if p is not None], self.options.stop_timeout)
        terminate([p for p in others if p is not None], self.options.stop_timeout)
        for name in ("nats", "postgres"):
            child = self.children.get(name)
            if child is not None and child.server is not None:
                child.server.stop()
        for child in self.children.values():
            code = child.poll()
            if code is not None and child.record.state != FAILED:
                child.record.exit_code = code
            if child.record.state != FAILED:
                child.record.state = STOPPED
            if child.ready_file is not None:
                with contextlib.suppress(FileNotFoundError):
                    child.ready_file.unlink()


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


async def _ensure_database(admin_url: str) -> None:
    """Creates the ``cairn`` database if missing (``services.migrate`` fills it)."""
    import asyncpg

    conn = await asyncpg.connect(admin_url)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()


def _port_free(port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------- locking and signals


@contextlib.contextmanager
def supervisor_lock(data_dir: Path) -> Iterator[None]:
    """Holds ``DIR/cluster.lock`` so that only one supervisor runs per data directory.

    Raises:
        ClusterStartError: another supervisor holds it.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "cluster.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ClusterStartError(f"another supervisor is running on {data_dir}") from exc
        yield
    finally:
        os.close(fd)


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


def configure_logging(stream: TextIO) -> None:
    """Logs the supervisor's structlog events as JSON lines to ``stream``."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


# --------------------------------------------------------------------------- entry points


def supervise(
    options: ClusterOptions,
    *,
    notify: Callable[[str], None] | None = None,
    on_healthy: Callable[[Supervisor], None] | None = None,
    hangup: bool = False,
) -> int:
    """Runs a supervisor in this process until SIGTERM/SIGINT; returns its exit code.

    Args:
        options: what to start and where.
        notify: receives one-line messages about restarts and failures.
        on_healthy: called once every service is ready.
        hangup: also treat SIGHUP as a stop request (a terminal that goes away).

    Returns:
        0 after a clean stop (including a stop requested during start-up), 1 if start-up failed.

    Raises:
        ClusterStartError: another supervisor runs on the data directory.
    """
    credentials.make_undumpable()
    with supervisor_lock(options.data_dir):
        logs_dir(options.data_dir).mkdir(parents=True, exist_ok=True)
        with open(supervisor_log(options.data_dir), "a", buffering=1) as stream:
            configure_logging(stream)
            sup = Supervisor(options, notify=notify)
            with stop_signals(sup.request_stop, hangup=hangup):
                try:
                    sup.start()
                except _Interrupted:
                    return 0
                except ClusterStartError:
                    return 1
                if on_healthy is not None:
                    on_healthy(sup)
                sup.run()
    return 0


def spawn_supervisor(options: ClusterOptions) -> subprocess.Popen[bytes]:
    """Starts ``python -m cairn.local.cluster supervise`` detached (its own session)."""
    cmd = [
        sys.executable, "-m", "cairn.local.cluster", "supervise",
        "--data-dir", str(options.data_dir),
        "--timeout", str(options.timeout),
        "--api-port", str(options.api_port),
        "--stop-timeout", str(options.stop_timeout),
        "--replicas", str(options.replicas),
    ]  # fmt: skip
    if options.slots is not None:
        cmd += ["--slots", str(options.slots)]
    if options.agents != 1:
        cmd += ["--agents", str(options.agents)]
    logs_dir(options.data_dir).mkdir(parents=True, exist_ok=True)
    with open(supervisor_log(options.data_dir), "ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=options.data_dir,
            env=child_env(),
            start_new_session=True,
        )


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


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cairn.local.cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    sup = sub.add_parser("supervise", help="run the supervisor of an embedded cluster")
    sup.add_argument("--data-dir", type=Path, required=True)
    sup.add_argument("--slots", type=int, default=None)
    sup.add_argument("--agents", type=int, default=1)
    sup.add_argument("--api-port", type=int, default=DEFAULT_API_PORT)
    sup.add_argument("--timeout", type=float, default=60.0)
    sup.add_argument("--stop-timeout", type=float, default=STOP_TIMEOUT)
    sup.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args(argv)
    options = ClusterOptions(
        data_dir=args.data_dir.resolve(),
        slots=args.slots,
        api_port=args.api_port,
        timeout=args.timeout,
        stop_timeout=args.stop_timeout,
        replicas=args.replicas,
        agents=args.agents,
    )
    try:
        return supervise(options)
    except ClusterStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_main())
