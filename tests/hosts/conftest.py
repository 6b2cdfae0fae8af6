"""The many-hosts test bed (``make test-hosts``): a control host and agent hosts, each a network
namespace with its own address on one bridge (:mod:`tests.hosts.netns`).

The control host runs PostgreSQL, nats-server and every service, all listening on its bridge
address (10.77.0.1), never on loopback; each agent host runs one agent, which joins with the
cluster's join token and advertises the address of its own host (the one on its route to the
API). The tests talk to the cluster from the root namespace, across the bridge.

Skipped unless ``CAIRN_HOSTS=1`` (``make test`` never runs it), and skipped with the reason
when the machine cannot make network namespaces (not root, no ``ip netns``). Everything is
torn down after each test, failed or not: the processes (SIGKILL for those left), the
namespaces, the links, the bridge and the iptables rule.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cairn.local.servers import (
    NatsCluster,
    ServerProcess,
    start_nats,
    start_nats_cluster,
    start_postgres,
)
from tests.e2e.harness import Cluster
from tests.helpers import create_database
from tests.hosts.netns import SUBNET, Network, call_in, unavailable

CONTROL = "control"
AGENT_HOSTS = ("agent-1", "agent-2")
"""The agent hosts a test starts agents on unless it asks for others; the agent on each has the
host's name as its id."""
SPARE_HOST = "agent-3"
"""A third agent host, where a test that needs one starts an agent."""
GATEWAY = "gateway"
"""A host for the API alone, for a test that needs it apart from the bus and the database."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips this directory's tests unless the hosts suite was asked for."""
    if os.environ.get("CAIRN_HOSTS") == "1":
        return
    skip = pytest.mark.skip(reason="hosts test bed: run with make test-hosts (CAIRN_HOSTS=1)")
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(skip)


@dataclass
class HostCluster(Cluster):
    """The e2e cluster of processes, each started in its host's namespace: an agent in the
    host named as its id, everything else in the control host."""

    network: Network = field(default_factory=lambda: Network([CONTROL]))
    api_on: str = CONTROL
    """The host the API runs in."""

    def host_of(self, name: str) -> str:
        """The host that process ``name`` runs in."""
        if name == "api":
            return self.api_on
        return name if name in self.network.hosts else CONTROL

    def start(self, name: str, module: str, *args: str) -> subprocess.Popen[bytes]:
        netns = self.network.hosts[self.host_of(name)].netns
        return call_in(netns, super().start, name, module, *args)


@pytest.fixture
def network() -> Iterator[Network]:
    """The bridge, the control host and the agent hosts; removed after the test."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    net = Network([CONTROL, *AGENT_HOSTS, SPARE_HOST, GATEWAY])
    try:
        net.up()
        yield net
    finally:
        net.down()


@pytest.fixture
def pg_server(network: Network, tmp_path: Path) -> Iterator[ServerProcess]:
    """PostgreSQL in the control host, on its bridge address, taking the subnet's clients."""
    control = network.hosts[CONTROL]
    server = call_in(
        control.netns,
        start_postgres,
        tmp_path / "pg",
        fast=True,
        host=control.address,
        clients=(SUBNET,),
    )
    yield server
    server.stop()


@pytest.fixture
def db_url(pg_server: ServerProcess) -> str:
    """A fresh database on the control host's PostgreSQL."""
    return create_database(pg_server)


@pytest.fixture
def nats_server(network: Network, tmp_path: Path) -> Iterator[ServerProcess]:
    """nats-server with JetStream in the control host, on its bridge address."""
    control = network.hosts[CONTROL]
    server = call_in(control.netns, start_nats, tmp_path / "nats", host=control.address)
    yield server
    server.stop()


@pytest.fixture
def nats_cluster(network: Network, tmp_path: Path) -> Iterator[NatsCluster]:
    """Three nats-servers routed into one JetStream cluster in the control host, every port
    (client, route, monitoring) on its bridge address."""
    control = network.hosts[CONTROL]
    cluster = call_in(
        control.netns, start_nats_cluster, tmp_path / "nats-cluster", host=control.address
    )
    yield cluster
    cluster.stop()


StartHosts = Callable[..., Awaitable[HostCluster]]


@pytest.fixture
async def hosts(
    network: Network, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[StartHosts]:
    """Starts the services in the control host and an agent in each agent host, logged in as
    the admin: ``await hosts(slots=2, agent_timeout=15.0, agents=AGENT_HOSTS, api_on=CONTROL)``;
    stopped after the test."""
    started: list[HostCluster] = []

    async def start(
        *,
        slots: int = 2,
        agent_timeout: float = 15.0,
        agents: tuple[str, ...] = AGENT_HOSTS,
        api_on: str = CONTROL,
    ) -> HostCluster:
        c = HostCluster(
            db_url,
            nats_server.url,
            tmp_path,
            api_host=network.hosts[api_on].address,
            network=network,
            api_on=api_on,
        )
        started.append(c)
        c.start_services("--agent-timeout", str(agent_timeout), timeout=60)
        c.start_agents(slots, "--rendezvous-timeout", "120", ids=agents)
        await c.login()
        return c

    try:
        yield start
    finally:
        for c in started:
            c.stop()
