"""Fixtures that start real servers: one PostgreSQL per test session (a fresh database per test)
and one nats-server per test, both on free loopback ports."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from cairn.local.servers import ServerProcess, start_nats, start_postgres
from events.bus import Bus
from events.store import EventStore
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
