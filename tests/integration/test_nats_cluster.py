"""A three-server NATS cluster: every member takes the cluster's credentials and refuses anonymous
clients, and a server that does not know the route password cannot join."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats
import pytest

from cairn.local.servers import NatsCluster, free_port, start_nats
from events.log.bus import EVENTS_STREAM, Bus, connect_options, server_urls, split_url
from tests.helpers import wait_until_sync


def monitor(port: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        return json.loads(resp.read())


async def test_every_member_takes_the_credentials_and_refuses_anonymous_clients(
    nats_cluster: NatsCluster,
) -> None:
    """Streams made through the cluster URL have three copies; each member alone accepts the
    admin's credentials (and reads that stream) and refuses a client without credentials."""
    bus = await Bus.connect(nats_cluster.url)
    try:
        info = await bus.js.stream_info(EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or []) == 2
    finally:
        await bus.close()
    _, creds = split_url(nats_cluster.url)
    for server in server_urls(nats_cluster.url):
        nc = await nats.connect(**connect_options(server, creds=creds), allow_reconnect=False)
        try:
            alone = await nc.jetstream(timeout=10).stream_info(EVENTS_STREAM)
            assert alone.config.name == EVENTS_STREAM
        finally:
            await nc.close()
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await nats.connect(servers=[server], allow_reconnect=False, max_reconnect_attempts=0)


def test_a_server_without_the_route_password_cannot_join(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    """A fourth nats-server routed at the members with a wrong password is refused by them
    (their logs say so) and appears in no member's routes."""
    first = nats_cluster.routes[0]
    intruder_routes = replace(
        first,
        server_name="intruder",
        cluster_port=free_port(),
        route_password="not-the-password",
        http_port=free_port(),
    )
    intruder = start_nats(
        tmp_path / "intruder", auth_dir=nats_cluster.auth_dir, routes=intruder_routes
    )
    try:
        member = nats_cluster.servers[0]

        def refused() -> bool:
            said = member.log_path.read_text(errors="replace")
            heard = intruder.log_path.read_text(errors="replace")
            return "Authentication Failure" in said and "Authorization Violation" in heard

        wait_until_sync(refused, timeout=30, every=0.1)
        for server in nats_cluster.servers:
            routez = monitor(server.extra["http_port"], "/routez")
            names = {r.get("remote_name") for r in routez.get("routes") or []}
            assert "intruder" not in names and names, names
    finally:
        intruder.stop()
