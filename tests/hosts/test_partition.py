"""A partition between the API and the bus: the API says it is not ready, and still serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from cairn.local.servers import ServerProcess
from events.domain.check import check_log
from events.log.bus import MAX_OUTSTANDING_PINGS, PING_INTERVAL_SECONDS
from events.log.store import EventStore
from tests.e2e.harness import experiment_state, wait_for
from tests.helpers import wait_until
from tests.hosts.conftest import CONTROL, GATEWAY, HostCluster, StartHosts
from tests.hosts.netns import Network
from tests.hosts.trials import SCRIPTED, scripted

NOTICED_WITHIN = PING_INTERVAL_SECONDS * (MAX_OUTSTANDING_PINGS + 1) + 10.0
"""Seconds a silent partition may go unnoticed: the client's unanswered pings, one ping
interval of slack and the API's own readiness refresh."""


async def readiness(cluster: HostCluster) -> tuple[int, dict[str, Any]]:
    """The status and body of the API's ``/readyz``."""
    async with aiohttp.ClientSession() as http, http.get(f"{cluster.api_url}/readyz") as resp:
        return resp.status, await resp.json()


async def test_api_cut_from_nats_is_unready_and_a_trial_still_completes(
    hosts: StartHosts,
    network: Network,
    nats_server: ServerProcess,
    store: EventStore,
    tmp_path: Path,
) -> None:
    """With the API on a host of its own, every packet it sends to nats-server is dropped (no
    reset: everything else reaches the bus): the client's pings alone notice within
    ``NOTICED_WITHIN`` and /readyz answers 503 naming the bus while an experiment submitted
    through it runs to completion; healed, the API reconnects and is ready again."""
    cluster = await hosts(slots=1, api_on=GATEWAY)

    async def ready() -> bool:
        return (await readiness(cluster))[0] == 200

    await wait_for(cluster, ready)
    bus = (network.hosts[CONTROL].address, nats_server.port)
    network.partition(GATEWAY, *bus, silent=True)

    async def unready() -> dict[str, Any] | None:
        status, body = await readiness(cluster)
        return body if status == 503 else None

    body = await wait_until(unready, timeout=NOTICED_WITHIN, every=0.1, detail=cluster.logs)
    assert network.silenced(GATEWAY) > 0, "the partition dropped the API's packets"
    assert body["checks"]["bus"] != "ok" and body["checks"]["database"] == "ok", body
    exp = await cluster.submit(scripted(tmp_path / "ckpt", steps=30, sleep=0.02), SCRIPTED)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=120)
    assert (await readiness(cluster))[0] == 503, "the partition held through the trial"
    network.heal(GATEWAY, *bus, silent=True)
    await wait_for(cluster, ready, timeout=60)
    assert await check_log(store) == []
