"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairn.local.servers import ServerProcess
from events.log.store import EventStore
from tests.e2e.harness import Cluster


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Relay, searcher, scheduler, API and one 4-slot agent, as processes."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=4)
    try:
        await c.login()
        yield c
    finally:
        c.stop()
