"""Fixtures that start real servers: one PostgreSQL per test session (a fresh database per test)
and one nats-server (or a cluster of three) per test, all on free loopback ports."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn.local.servers import (
    NatsCluster,
    ServerProcess,
    start_nats,
    start_nats_cluster,
    start_postgres,
)
from events.log.bus import Bus
from events.log.store import EventStore
from tests.helpers import create_database

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


@pytest.fixture(scope="session")
def scratch() -> Iterator[Path]:
    """A scratch directory for the whole session, removed at the end."""
    path = Path(tempfile.mkdtemp(prefix="cairn-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server(scratch: Path) -> Iterator[ServerProcess]:
    """A real PostgreSQL server for the session."""
    server = start_postgres(scratch / "pg", fast=True)
    yield server
    server.stop()


@pytest.fixture
def db_url(pg_server: ServerProcess) -> str:
    """A DSN to a fresh, empty database of its own for one test."""
    return create_database(pg_server)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real nats-server with JetStream for one test."""
    server = start_nats(tmp_path / "nats")
    yield server
    server.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """Three real nats-servers routed into one JetStream cluster (each its own store) for one
    test; its ``url`` names all three."""
    cluster = start_nats_cluster(tmp_path / "nats-cluster")
    yield cluster
    cluster.stop()


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[EventStore]:
    """An event store on the test's own database."""
    s = await EventStore.connect(db_url)
    yield s
    await s.close()


@pytest.fixture
async def bus(nats_server: ServerProcess) -> AsyncIterator[Bus]:
    """A bus connection to the test's own nats-server."""
    b = await Bus.connect(nats_server.url)
    yield b
    await b.close()


@pytest.fixture
def service_env() -> Callable[..., dict[str, str]]:
    """Builds the environment for a service subprocess (repo on PYTHONPATH, optional faults)."""

    def make(faults: str = "", **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT)
        env["CAIRN_FAULTS"] = faults
        env.update(extra)
        return env

    return make


class S3Server:
    """A local S3-compatible server (moto's, a real HTTP server in its own process) with one
    empty bucket per test; the credentials are fake but must be given."""

    ACCESS_KEY = "cairn-test-access"
    SECRET_KEY = "cairn-test-secret-0123456789"

    def __init__(self, url: str, bucket: str) -> None:
        self.url = url
        self.bucket = bucket

    def client(self) -> Any:
        """A boto3 client for the server."""
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id=self.ACCESS_KEY,
            aws_secret_access_key=self.SECRET_KEY,
            region_name="us-east-1",
        )

    def object_keys(self) -> list[str]:
        """Every object key in the bucket."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


@pytest.fixture(scope="session")
def s3_process(scratch: Path) -> Iterator[str]:
    """A moto S3 server process on a free loopback port for the session; yields its URL."""
    from cairn.local.servers import free_port
    from tests.helpers import wait_until_sync

    port = free_port()
    log = (scratch / "moto.log").open("wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until_sync(listening, timeout=60, detail=lambda: f"moto exited: {proc.poll()}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()
        log.close()


@pytest.fixture
def s3_server(s3_process: str) -> S3Server:
    """The session's S3 server with a fresh, empty bucket for this test."""
    server = S3Server(s3_process, f"cairn-{uuid.uuid4().hex[:12]}")
    server.client().create_bucket(Bucket=server.bucket)
    return server
