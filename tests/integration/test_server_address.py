"""PostgreSQL and nats-server on an address other than 127.0.0.1 (a control host that other
hosts reach; the namespace test bed of ``tests/hosts`` runs them on a bridge address)."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import nats
import pytest

from cairn.local.servers import ServerStartError, start_nats, start_postgres
from events.log.bus import connect_options

ADDRESS = "127.0.0.2"
"""A loopback address that is not 127.0.0.1 (Linux answers on all of 127.0.0.0/8)."""


async def test_postgres_listens_on_the_given_address_and_takes_the_given_clients(
    tmp_path: Path,
) -> None:
    """Started with a host, PostgreSQL listens there and its URL names it; the client networks
    are added to pg_hba.conf once (password-checked), however often it starts."""
    data_dir = tmp_path / "pg"
    for _ in range(2):
        server = start_postgres(data_dir, fast=True, host=ADDRESS, clients=("127.0.0.0/8",))
        try:
            assert f"@{ADDRESS}:{server.port}/" in server.url
            conn = await asyncpg.connect(server.url)
            try:
                assert await conn.fetchval("SELECT host(inet_server_addr())") == ADDRESS
            finally:
                await conn.close()
        finally:
            server.stop()
    lines = (data_dir / "pg_hba.conf").read_text().splitlines()
    added = [line.split() for line in lines if "127.0.0.0/8" in line]
    assert added == [["host", "all", "all", "127.0.0.0/8", "scram-sha-256"]]


def test_postgres_refuses_a_client_network_that_is_none(tmp_path: Path) -> None:
    """A client entry that is no network fails the start with a message naming it."""
    with pytest.raises(ServerStartError, match=re.escape("'10.0.0.0/33' is no network")):
        start_postgres(tmp_path / "pg", fast=True, clients=("10.0.0.0/33",))


async def test_nats_listens_on_the_given_address(tmp_path: Path) -> None:
    """Started with a host, nats-server listens there and its URL names it."""
    server = start_nats(tmp_path / "nats", host=ADDRESS)
    try:
        assert server.url.startswith(f"nats://{ADDRESS}:{server.port}")
        nc = await nats.connect(
            **connect_options(server.url), allow_reconnect=False, connect_timeout=10
        )
        try:
            await nc.flush(timeout=10)
            assert nc.connected_url is not None and nc.connected_url.hostname == ADDRESS
        finally:
            await nc.close()
    finally:
        server.stop()
