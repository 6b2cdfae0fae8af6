"""Every cairn service as a child process on a given database and nats-server.

Used by end-to-end tests and benchmarks, which need to own (and SIGKILL) each process; ``cairn
up`` has its own supervisor with restarts.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cairn.local import service_credentials
from cairn.local.environment import service_nats_env
from cairn.local.layout import join_token_file
from cairn.local.private_files import write_private
from cairn.local.servers import LOOPBACK, free_port, wait_for_port
from cairn.local.stopping import terminate
from cairn.local.topology import service_of

ROOT = Path(__file__).resolve().parents[2]
PREPARE_TIMEOUT = 120.0
"""Seconds the migrations and roles may take before the first service starts."""


@dataclass
class ProcessCluster:
    """Relay, searcher, scheduler, API and agents as processes; logs in ``workdir/<name>.log``.

    As under ``cairn up``, ``db_url`` (a superuser's) is used only to migrate and to make the
    services' roles before the first service starts; each service connects as its own role and
    finds its credentials in files under ``workdir/secrets`` (see
    :mod:`cairn.local.service_credentials`), never in its environment.

    Attributes:
        db_url: a superuser's DSN of the cluster's database.
        nats_url: the nats-server's URL, as :func:`cairn.local.servers.start_nats` gives it.
        workdir: logs, secrets and agents' work directories.
        admin_password: the initial admin's password (random unless given).
        api_port: the gateway's port.
        api_host: the address the gateway listens on, and every process reaches it by.
        procs: the processes started, by name.
        agents: the names of the agents among them.
    """

    db_url: str
    nats_url: str
    workdir: Path
    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    api_port: int = field(default_factory=free_port)
    api_host: str = LOOPBACK
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    agents: set[str] = field(default_factory=set)
    cluster_config: Path | None = None
    _prepared: bool = field(default=False, repr=False)

    @property
    def api_url(self) -> str:
        """The API gateway's base URL."""
        return f"http://{self.api_host}:{self.api_port}"

    @property
    def secrets(self) -> Path:
        """The directory of the services' credential files."""
        return service_credentials.secrets_dir(self.workdir)

    def base_env(self) -> dict[str, str]:
        """What every service's environment holds (no secret)."""
        env = dict(os.environ)
        env.update(
            PYTHONPATH=str(ROOT),
            CAIRN_API_URL=self.api_url,
            CAIRN_FAULTS="",
            CAIRN_CLUSTER_CONFIG=str(self.cluster_config or ""),
        )
        return env

    def prepare(self) -> None:
        """Migrates the database and makes the services' roles and credential files (once;
        :meth:`start` does it before the first service)."""
        if self._prepared:
            return
        service_credentials.grant_roles(
            self.db_url, self.secrets, env=self.base_env(), timeout=PREPARE_TIMEOUT
        )
        write_private(self.workdir / service_credentials.ADMIN_PASSWORD_FILE, self.admin_password)
        self._prepared = True

    def env(self, service: str) -> dict[str, str]:
        """The environment of ``service`` (``api``, ``agent``, ...): the paths of its
        credential files and no secret; each service its own NATS user, agents the join
        token file (see :func:`cairn.local.environment.service_nats_env`)."""
        bus = service_nats_env(service, self.nats_url, self.workdir)
        files = service_credentials.service_files(
            self.secrets,
            service,
            nats_url=bus.pop("CAIRN_NATS"),
            admin_password=self.workdir / service_credentials.ADMIN_PASSWORD_FILE,
        )
        return service_credentials.service_env({**self.base_env(), **bus}, files)

    def allow_checkpoints_under(self, *roots: Path) -> None:
        """Writes ``workdir/cluster.yaml`` allowing checkpoint storage under ``roots`` (besides
        the default root) and has every service started from now on read it."""
        path = self.workdir / "cluster.yaml"
        listed = ", ".join(f'"{root}"' for root in roots)
        path.write_text(f"checkpoint_storage:\n  allowed_roots: [{listed}]\n")
        self.cluster_config = path

    @property
    def join_token(self) -> str:
        """The cluster's join token (created on first use)."""
        return join_token_file(self.workdir).read_text().strip()

    def start(
        self, name: str, module: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Starts ``python -m module args`` in its own session, logging to ``<name>.log``
        (``extra_env``: variables added to its environment, such as ``CAIRN_FAULTS``)."""
        self.prepare()
        service = service_of(module.removeprefix("services."))
        with open(self.workdir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=self.workdir,
                env={**self.env(service), **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def start_services(self, *scheduler_args: str, timeout: float = 60.0) -> None:
        """Starts relay, searcher, scheduler and API; returns once the API listens."""
        self.start("relay", "services.relay")
        self.start("searcher", "services.searcher")
        self.start("scheduler", "services.scheduler", *scheduler_args)
        api = self.start(
            "api", "services.api", "--host", self.api_host, "--port", str(self.api_port)
        )
        wait_for_port(self.api_port, timeout, api, host=self.api_host)

    def start_agent(self, agent_id: str, slots: int, *args: str) -> subprocess.Popen[bytes]:
        """Starts an agent with ``slots`` artificial CPU slots (and any extra flags)."""
        self.agents.add(agent_id)
        return self.start(
            agent_id,
            "services.agent",
            "--agent-id", agent_id,
            "--artificial-slots", str(slots),
            "--work-dir", str(self.workdir / agent_id),
            *args,
        )  # fmt: skip

    def kill(self, name: str) -> None:
        """SIGKILLs a process and everything it started."""
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the agents, then the services: SIGTERM, and SIGKILL to the groups of those
        still running after ``timeout`` seconds. Agents go first so that the runs they stop are
        reported to an API that still listens (an agent retries that report until it is taken).
        """
        agents = [p for name, p in self.procs.items() if name in self.agents]
        terminate(agents, timeout)
        terminate([p for p in self.procs.values() if p not in agents], timeout)

    def check_alive(self) -> None:
        """Raises if a process exited, with the tail of its log."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def logs(self, tail: int = 3000) -> str:
        """The tails of every process's log."""
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-tail:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )
