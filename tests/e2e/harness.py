"""A whole cairn cluster of real processes for end-to-end tests, and an HTTP client for it."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from cairn.local.servers import free_port, wait_for_port
from events.store import EventStore
from tests.helpers import ROOT

AGENT_TOKEN = "e2e-agent-token"
SERVICES = ("relay", "searcher", "scheduler")


def code_tarball(directory: Path) -> str:
    """The directory as a base64 tar.gz, as the CLI uploads it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                tar.add(path, arcname=str(path.relative_to(directory)))
    return base64.b64encode(buf.getvalue()).decode()


@dataclass
class Cluster:
    """Service processes on one database and one nats-server."""

    db_url: str
    nats_url: str
    workdir: Path
    api_port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    token: str = ""

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PYTHONPATH=str(ROOT),
            CAIRN_DB=self.db_url,
            CAIRN_NATS=self.nats_url,
            CAIRN_API_URL=self.api_url,
            CAIRN_AGENT_TOKEN=AGENT_TOKEN,
            CAIRN_FAULTS="",
        )
        return env

    def start(self, name: str, module: str, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (owned by the process)
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=self.workdir,
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_all(self, *, slots: int = 2, agent_timeout: float = 15.0) -> None:
        self.start("relay", "services.relay")
        self.start("searcher", "services.searcher")
        self.start("scheduler", "services.scheduler", "--agent-timeout", str(agent_timeout))
        self.start("api", "services.api", "--port", str(self.api_port))
        wait_for_port(self.api_port, 30, self.procs["api"])
        self.start_agent("agent-a", slots)

    def start_agent(self, agent_id: str, slots: int) -> subprocess.Popen[bytes]:
        return self.start(
            agent_id,
            "services.agent",
            "--agent-id", agent_id,
            "--artificial-slots", str(slots),
            "--work-dir", str(self.workdir / agent_id),
            "--heartbeat", "0.5",
            "--preempt-timeout", "10",
            "--kill-grace", "2",
        )  # fmt: skip

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with (
            aiohttp.ClientSession() as http,
            http.request(
                method, f"{self.api_url}/api/v1{path}", json=body, headers=headers
            ) as resp,
        ):
            data = await resp.json()
            if resp.status >= 400:
                raise AssertionError(f"{method} {path} -> {resp.status}: {data}")
            return data

    async def login(self) -> None:
        for _ in range(100):
            try:
                data = await self.request(
                    "POST", "/auth/login", {"username": "admin", "password": "admin"}
                )
                self.token = data["token"]
                return
            except (aiohttp.ClientError, AssertionError):
                await asyncio.sleep(0.1)
        raise AssertionError("could not log in")

    async def submit(self, config: dict[str, Any], code_dir: Path) -> int:
        data = await self.request(
            "POST",
            "/experiments",
            {"config": config, "code": code_tarball(code_dir), "activate": True},
        )
        return int(data["id"])

    async def action(self, experiment_id: int, verb: str) -> None:
        await self.request("POST", f"/experiments/{experiment_id}/{verb}")


async def events_of(store: EventStore, *types: str) -> list[Any]:
    """Every event of these types, in log order."""
    return await store.read_all(limit=1_000_000, types=list(types) or None)


async def experiment_state(store: EventStore, experiment_id: int) -> str | None:
    states = [
        e.payload["state"]
        for e in await events_of(store, "ExperimentStateChanged")
        if e.payload["experiment_id"] == experiment_id
    ]
    return states[-1] if states else None


async def wait_for(cluster: Cluster, predicate: Any, timeout: float = 60.0) -> None:
    """Polls an async predicate; on timeout fails with the services' logs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"condition not met in {timeout}s\n{cluster.logs()}")
