"""The supervisor: starts a cluster's servers and services, restarts what dies, stops it all.

One supervisor process owns everything on a data directory (:mod:`cairn.local.lock` keeps it to
one): a real PostgreSQL (``DIR/pg``), a nats-server with JetStream (``DIR/nats``) and one process
per service (``python -m services.<name>``). Only the supervisor holds the PostgreSQL superuser's
credential: before the services start it creates the database (:mod:`cairn.local.database`),
applies every migration and makes each service's role with only its rights (``python -m
services.migrate``); each service gets its own credentials in files of its own (see
:mod:`cairn.local.service_credentials`), never in its environment. It records pids, ports and
per-process state in ``DIR/cluster.json`` (see :mod:`cairn.local.state`) after every change,
restarts what dies with backoff (the budget is in :mod:`cairn.local.children`; past it the process
is marked ``failed``) and stops everything in order when asked: agents, then the other services,
then nats-server, then PostgreSQL (see :meth:`Supervisor._stop_all` for why the agents go first).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import structlog

from cairn.errors import CairnError
from cairn.local import service_credentials
from cairn.local.children import RESTART_WINDOW, Child
from cairn.local.database import DATABASE, ensure_database
from cairn.local.environment import child_env, service_nats_env
from cairn.local.layout import cluster_config_path, run_dir
from cairn.local.logs import indent, logs_dir, tail
from cairn.local.options import ClusterOptions
from cairn.local.ports import api_port
from cairn.local.servers import ServerStartError, free_port, start_nats, start_postgres
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
    process_create_time,
    read_state,
    write_state,
)
from cairn.local.stopping import reap_leftovers, terminate
from cairn.local.topology import replica_names, service_names, service_of
from events import settings
from events.domain.config.cluster import ClusterConfigError, load_cluster_config
from events.log.redact import redact_url

POLL_INTERVAL = 0.2

log = structlog.get_logger("supervisor")


def metrics_port_name(process: str) -> str:
    """The key of process ``process``'s metrics port in the cluster state's ``ports``."""
    return f"{process}-metrics"


class ClusterStartError(CairnError):
    """The embedded cluster did not come up (the message says which part and why)."""


class StartInterrupted(ClusterStartError):
    """A stop was requested while the cluster was starting."""


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
        self.children: dict[str, Child] = {}
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
            raise StartInterrupted("start-up interrupted by a stop request")

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
            interrupted = isinstance(exc, StartInterrupted)
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
            raise ClusterStartError(f"invalid cluster config:\n{indent(str(exc))}") from exc

    def _add(self, record: ProcessState) -> Child:
        child = Child(record)
        self.children[record.name] = child
        self.state.processes[record.name] = record
        return child

    def _start_servers(self) -> None:
        pg = self._add(ProcessState(name="postgres", kind="server"))
        try:
            pg.server = start_postgres(self.data_dir / "pg", timeout=self._remaining())
        except ServerStartError as exc:
            raise ClusterStartError(
                f"postgres did not start: {exc}\n{indent(tail(self.data_dir / 'pg.log'))}"
            ) from exc
        self._server_started(pg)
        self._check_stop()
        nats = self._add(ProcessState(name="nats", kind="server"))
        try:
            nats.server = start_nats(self.data_dir / "nats", timeout=min(30.0, self._remaining()))
        except ServerStartError as exc:
            raise ClusterStartError(
                f"nats did not start: {exc}\n{indent(tail(self.data_dir / 'nats.log'))}"
            ) from exc
        self._server_started(nats)
        assert pg.server is not None
        base = pg.server.url.rsplit("/", 1)[0]
        self.state.dsn = f"{base}/{DATABASE}"
        self.state.nats_url = nats.server.url
        self.state.ports.update(postgres=pg.server.port, nats=nats.server.port)
        self._save()

    def _server_started(self, child: Child) -> None:
        assert child.server is not None
        child.started(child.server.proc)
        child.record.log = str(child.server.log_path)
        child.record.state = RUNNING
        log.info("server started", name=child.record.name, pid=child.record.pid)

    def _prepare_database(self) -> None:
        pg = self.children["postgres"].server
        assert pg is not None
        try:
            asyncio.run(asyncio.wait_for(ensure_database(pg.url), self._remaining()))
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
        port = api_port(self.options.api_port)
        self.state.ports["api"] = port
        self.state.api_url = f"http://127.0.0.1:{port}"
        service_credentials.ensure_admin_password(self.data_dir, settings.ADMIN_PASSWORD.get())
        for service in service_names(self.options.agents):
            for name in replica_names(service, self.options.replicas):
                if name != "api":  # the gateway serves /metrics on its own port
                    self.state.ports.setdefault(metrics_port_name(name), free_port())
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

    def _spawn(self, child: Child) -> None:
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
                    "CAIRN_METRICS_ADDRESS": self._metrics_address(name),
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

    def _metrics_address(self, name: str) -> str:
        """Where process ``name`` serves /metrics and its probes: loopback only ('' for the
        gateway, which serves them on its own port)."""
        port = self.state.ports.get(metrics_port_name(name))
        return f"127.0.0.1:{port}" if port else ""

    def _wait_ready(self) -> None:
        services = [c for c in self.children.values() if c.record.kind == "service"]
        while True:
            self._check_stop()
            for child in self.children.values():
                code = child.poll()
                if code is not None:
                    raise ClusterStartError(
                        f"{child.record.name} exited with status {code} during start-up; "
                        f"last lines of {child.record.log}:\n{indent(tail(child.record.log))}"
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
                    f"  {c.record.name} (log {c.record.log}):\n{indent(tail(c.record.log))}"
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

    def _on_exit(self, child: Child, code: int) -> None:
        rec = child.record
        now = time.monotonic()
        rec.exit_code = code
        rec.last_exit_at = time.time()
        delay = child.crashed(now)
        exit_facts = {"name": rec.name, "pid": rec.pid, "exit_code": code, "restarts": rec.restarts}
        if delay is None:
            rec.state = FAILED
            log.error(
                "process failed: too many restarts, leaving it down",
                **exit_facts,
                window_s=RESTART_WINDOW,
                log_path=rec.log,
            )
            self.notify(f"{rec.name} died (status {code}) too often; marked failed, see {rec.log}")
            return
        rec.state = RESTARTING
        log.warning("process died; restarting", **exit_facts, backoff_s=delay, log_path=rec.log)
        self.notify(f"{rec.name} (pid {rec.pid}) died with status {code}; restarting in {delay}s")

    def _restart(self, child: Child) -> None:
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

    def _restart_server(self, child: Child) -> None:
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
