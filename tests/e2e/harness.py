"""A whole cairn cluster of real processes for end-to-end tests, and an HTTP client for it."""

from __future__ import annotations

import base64
import contextlib
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from cairn.client import code_tarball as client_tarball
from cairn.local.processes import ProcessCluster
from events.domain.names import experiment_stream
from events.log.store import EventStore
from tests.helpers import run_pids, wait_until

GANG_AGENTS = ("agent-a", "agent-b")


def code_tarball(directory: Path) -> str:
    """The directory as a base64 tar.gz, as the CLI uploads it."""
    return base64.b64encode(client_tarball(directory)).decode()


@dataclass
class Cluster(ProcessCluster):
    """Every service as a process, plus an HTTP client for the API."""

    token: str = ""

    def __post_init__(self) -> None:
        # The tests keep shared_fs checkpoints in their temporary directories.
        self.allow_checkpoints_under(self.workdir)

    def start_all(self, *, slots: int = 2, agent_timeout: float = 15.0) -> None:
        self.start_services("--agent-timeout", str(agent_timeout), timeout=30)
        self.start_agent("agent-a", slots)

    def start_agents(self, slots: int, *args: str, ids: tuple[str, ...] = GANG_AGENTS) -> None:
        """Starts an agent per id with ``slots`` CPU slots each (and ``args``)."""
        for agent_id in ids:
            self.start_agent(agent_id, slots, *args)

    def start_agent(self, agent_id: str, slots: int, *args: str) -> subprocess.Popen[bytes]:
        return super().start_agent(
            agent_id,
            slots,
            "--heartbeat",
            "0.5",
            "--preempt-timeout",
            "10",
            "--kill-grace",
            "2",
            *args,
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
        async def logged_in() -> bool:
            try:
                data = await self.request(
                    "POST", "/auth/login", {"username": "admin", "password": self.admin_password}
                )
            except (aiohttp.ClientError, AssertionError):
                return False  # the API is still starting
            self.token = data["token"]
            return True

        await wait_until(logged_in, timeout=30, every=0.1, detail=self.logs)

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


async def trial_ids(store: EventStore, experiment_id: int) -> list[int]:
    """The trials the searcher requested for ``experiment_id`` so far, in their ``seq`` order."""
    stream = await store.read_stream(experiment_stream(experiment_id))
    requested = [e.payload for e in stream if e.type == "TrialRequested"]
    return [int(p["trial_id"]) for p in sorted(requested, key=lambda p: p["seq"])]


async def first_trial(cluster: Cluster, store: EventStore, experiment_id: int) -> int:
    """The id of the experiment's first trial, once the searcher has requested it."""

    async def requested() -> bool:
        return bool(await trial_ids(store, experiment_id))

    await wait_for(cluster, requested)
    return (await trial_ids(store, experiment_id))[0]


async def experiment_state(store: EventStore, experiment_id: int) -> str | None:
    states = [
        e.payload["state"]
        for e in await events_of(store, "ExperimentStateChanged")
        if e.payload["experiment_id"] == experiment_id
    ]
    return states[-1] if states else None


async def wait_for(cluster: Cluster, predicate: Any, timeout: float = 60.0) -> None:
    """:func:`~tests.helpers.wait_until` that fails with the services' logs."""
    await wait_until(predicate, timeout, every=0.2, detail=cluster.logs)


def rank_pid(allocation_id: str, rank: int) -> int | None:
    """The process of global ``rank`` of a run (a ``torchrun`` worker), if it runs."""
    for pid in run_pids(allocation_id):
        try:
            if psutil.Process(pid).environ().get("RANK") == str(rank):
                return pid
        except psutil.Error:
            continue
    return None


@contextlib.asynccontextmanager
async def gang_processes(
    db_url: str, nats_url: str, workdir: Path, slots: int, rendezvous_timeout: float
) -> AsyncIterator[Cluster]:
    """Every service as a process and the two gang agents with ``slots`` CPU slots each, logged
    in; stopped on exit."""
    c = Cluster(db_url, nats_url, workdir)
    c.start_services("--agent-timeout", "30", timeout=30)
    c.start_agents(slots, "--rendezvous-timeout", str(rendezvous_timeout))
    try:
        await c.login()
        yield c
    finally:
        c.stop()
