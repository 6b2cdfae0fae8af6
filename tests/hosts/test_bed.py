"""The test bed itself: each host is its own network stack, and the cluster spans them."""

from __future__ import annotations

from cairn.local.servers import ServerProcess
from events.log.store import EventStore
from tests.e2e.harness import wait_for
from tests.hosts.conftest import AGENT_HOSTS, CONTROL, StartHosts
from tests.hosts.netns import Network, listening, namespace_pids


async def test_agents_join_from_their_own_hosts_and_nothing_listens_on_loopback(
    hosts: StartHosts,
    network: Network,
    store: EventStore,
    pg_server: ServerProcess,
    nats_server: ServerProcess,
) -> None:
    """Each agent runs in its own host and joins with the join token across the bridge; the
    database, the bus and the API listen on the control host's bridge address only."""
    cluster = await hosts()
    for agent in AGENT_HOSTS:
        assert cluster.procs[agent].pid in namespace_pids(network.hosts[agent].netns)

    async def registered() -> bool:
        events = await store.read_all(limit=1000, types=["AgentRegistered"])
        return {e.payload["agent_id"] for e in events} == set(AGENT_HOSTS)

    await wait_for(cluster, registered)
    issued = await cluster.request("GET", "/agent-credentials")
    assert set(AGENT_HOSTS) <= {c["agent_id"] for c in issued["credentials"]}
    control = network.hosts[CONTROL]
    sockets = listening(cluster.procs["api"].pid)
    for port in (pg_server.port, nats_server.port, cluster.api_port):
        assert (control.address, port) in sockets
    assert not {s for s in sockets if s[0].startswith("127.")}, sockets
