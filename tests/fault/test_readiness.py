"""/readyz under real faults: a SIGKILLed nats-server or PostgreSQL turns the gateway and a
service unready, naming the check that fails, and a restarted server makes them ready again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cairn.local.servers import ServerProcess, start_nats, start_postgres
from tests.e2e.harness import wait_for
from tests.e2e.observed import ObservedCluster
from tests.helpers import create_database


async def failing(cluster: ObservedCluster, name: str, check: str) -> bool:
    """Whether ``name``'s /readyz answers 503 with ``check`` failing (and the process lives)."""
    status, body = await cluster.get(name, "/readyz")
    return status == 503 and json.loads(body)["checks"].get(check, "ok") != "ok"


def start_observed_services(cluster: ObservedCluster) -> None:
    """The relay, the scheduler and the gateway, each serving its probes."""
    cluster.start_observed("relay", "services.relay")
    cluster.start_observed("scheduler", "services.scheduler")
    cluster.start("api", "services.api", "--port", str(cluster.api_port))


async def test_readiness_fails_while_nats_is_down_and_recovers(
    db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> None:
    """SIGKILL nats-server: the gateway's and the scheduler's /readyz answer 503 naming the bus
    while /healthz still answers; nats-server restarted on its port and data, both are ready."""
    cluster = ObservedCluster(db_url, nats_server.url, tmp_path)
    restarted: ServerProcess | None = None
    try:
        start_observed_services(cluster)
        for name in ("api", "scheduler"):
            await wait_for(cluster, lambda name=name: cluster.ready(name))
        nats_server.kill()
        for name in ("api", "scheduler"):
            await wait_for(cluster, lambda name=name: failing(cluster, name, "bus"))
            assert (await cluster.get(name, "/healthz"))[0] == 200
        restarted = await asyncio.to_thread(start_nats, nats_server.data_dir, port=nats_server.port)
        for name in ("api", "scheduler"):
            await wait_for(cluster, lambda name=name: cluster.ready(name))
    finally:
        cluster.stop()
        if restarted is not None:
            restarted.stop()


async def test_readiness_fails_while_the_database_is_down_and_recovers(
    nats_server: ServerProcess, tmp_path: Path
) -> None:
    """SIGKILL PostgreSQL (a server of the test's own): the gateway's /readyz answers 503 naming
    the database while its /healthz answers, the scheduler is not ready; PostgreSQL restarted on
    its port and data (and the scheduler by its supervisor, if it exited), both are ready."""
    server = await asyncio.to_thread(start_postgres, tmp_path / "pg", fast=True)
    cluster: ObservedCluster | None = None
    try:
        db_url = await asyncio.to_thread(create_database, server)
        (tmp_path / "cluster").mkdir()
        cluster = ObservedCluster(db_url, nats_server.url, tmp_path / "cluster")
        start_observed_services(cluster)
        for name in ("api", "scheduler"):
            await wait_for(cluster, lambda name=name: cluster.ready(name))
        server.kill()
        await wait_for(cluster, lambda: failing(cluster, "api", "database"))
        assert (await cluster.get("api", "/healthz"))[0] == 200

        async def scheduler_unready() -> bool:
            return not await cluster.ready("scheduler")

        await wait_for(cluster, scheduler_unready)
        server = await asyncio.to_thread(
            start_postgres, tmp_path / "pg", port=server.port, fast=True
        )
        await wait_for(cluster, lambda: cluster.ready("api"))

        async def scheduler_ready() -> bool:
            if cluster.procs["scheduler"].poll() is not None:
                # A decider whose lease's session died exits (maybe only now, after its
                # "service failed"); its supervisor (cairn up, compose's restart policy) starts
                # it again, as here.
                cluster.start_observed("scheduler", "services.scheduler")
            return await cluster.ready("scheduler")

        await wait_for(cluster, scheduler_ready)
    finally:
        if cluster is not None:
            cluster.stop()
        server.stop()
