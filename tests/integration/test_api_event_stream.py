"""The log as Server-Sent Events over real HTTP: reading, resuming with Last-Event-ID, filters,
and who may stream what."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from events.domain.types import ExperimentStateChanged
from events.log.store import EventStore
from services.api.auth import create_user
from tests.helpers import wait_until
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def read_events(
    api: Api,
    token: str,
    count: int,
    *,
    query: str = "",
    last_event_id: int | None = None,
    timeout: float = 10.0,
    into: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Opens the stream, collects ``count`` events (``id``, ``event``, ``data``), then leaves;
    ``into``: a list to collect them in, which the caller can watch fill."""
    headers = {"Authorization": f"Bearer {token}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    events: list[dict[str, Any]] = [] if into is None else into

    async def collect() -> None:
        async with api.session.get(
            f"{api.url}/api/v1/events/stream{query}", headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.content_type == "text/event-stream"
            current: dict[str, Any] = {}
            async for raw in resp.content:
                line = raw.decode().rstrip("\n")
                if not line:
                    if "id" in current:
                        events.append(current)
                        if len(events) == count:
                            return
                    current = {}
                elif not line.startswith(":"):
                    field, _, value = line.partition(": ")
                    current[field] = json.loads(value) if field == "data" else value

    await asyncio.wait_for(collect(), timeout)
    return events


async def test_stream_reads_and_resumes_after_last_event_id(api: Api, store: EventStore) -> None:
    """An admin reads events in position order; reconnecting with Last-Event-ID (which wins over
    ``after``) yields only later ones, including events appended while connected."""
    await submit_experiment(store, 1)
    await allocate(store, 11)
    first = await read_events(api, api.admin, 3)
    assert [int(e["id"]) for e in first] == [1, 2, 3]
    assert [e["event"] for e in first] == [
        "ExperimentSubmitted",
        "TrialRequested",
        "SlotsAllocated",
    ]
    assert first[2]["data"]["stream_id"] == "trial-11" and first[2]["data"]["position"] == 3

    received: list[dict[str, Any]] = []
    reader = asyncio.create_task(
        read_events(api, api.admin, 2, query="?after=0", last_event_id=2, into=received)
    )
    await wait_until(lambda: received)  # connected, and past the events already logged
    await store.append("experiment-1", [ExperimentStateChanged(experiment_id=1, state="PAUSED")])
    resumed = await reader
    assert [int(e["id"]) for e in resumed] == [3, 4]
    assert resumed[1]["data"]["payload"]["state"] == "PAUSED"
    typed = await read_events(api, api.admin, 1, query="?types=ExperimentStateChanged")
    assert [int(e["id"]) for e in typed] == [4]


async def test_users_stream_only_their_own_experiment(api: Api, store: EventStore) -> None:
    """A user streams one of their experiments (its experiment and trial streams only); another
    user's experiment or no experiment is 403; bad input is 400."""
    await submit_experiment(store, 1, owner="bob")
    await submit_experiment(store, 2, owner="admin")
    await allocate(store, 21)
    await allocate(store, 11)
    assert await create_user(store, "bob", "pw", admin=False)
    bob = await api.login("bob", "pw")
    own = await read_events(api, bob, 3, query="?experiment_id=1")
    assert [(e["data"]["stream_id"], e["event"]) for e in own] == [
        ("experiment-1", "ExperimentSubmitted"),
        ("experiment-1", "TrialRequested"),
        ("trial-11", "SlotsAllocated"),
    ]
    for query, expected in (
        ("?experiment_id=2", 403),
        ("", 403),
        ("?experiment_id=99", 404),
        ("?experiment_id=x", 400),
        ("?types=NoSuchEvent&experiment_id=1", 400),
        ("?after=-4&experiment_id=1", 400),
    ):
        status, body = await api.call("GET", f"/api/v1/events/stream{query}", token=bob)
        assert status == expected and "error" in body, (query, body)
    async with api.session.get(
        f"{api.url}/api/v1/events/stream",
        headers={"Authorization": f"Bearer {api.admin}", "Last-Event-ID": "abc"},
    ) as resp:
        assert resp.status == 400 and "error" in await resp.json()
