"""Outside subscribers over a real gateway: the event stream's stream filter, and the
standalone usage subscriber (examples/subscriber), which, killed with SIGKILL mid-stream and
started again, holds every allocation fact in its CSV exactly once."""

from __future__ import annotations

import asyncio
import csv
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.domain.types import TrialExited, TrialStarted
from events.log.store import EventStore
from tests.helpers import wait_until
from tests.integration.test_api_event_stream import read_events
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "subscriber" / "follow_usage.py"
USAGE_TYPES = {"SlotsAllocated", "TrialStarted", "TrialExited", "SlotsReleased"}
TRIALS = 30


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


def positions(path: Path) -> list[int]:
    """The positions of the CSV's complete rows, in file order."""
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return [int(row["position"]) for row in csv.DictReader(f)]


async def start(api: Api, out: Path) -> asyncio.subprocess.Process:
    """Starts the subscriber as its own process, as a user would."""
    env = {**os.environ, "CAIRN_TOKEN": api.admin}
    return await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--master", api.url, "--out", str(out), env=env
    )


async def produce(store: EventStore) -> None:
    """Appends TRIALS allocations' lifecycles, paced so that the subscriber reads them live."""
    for n in range(1, TRIALS + 1):
        trial_id = 10 + n
        alloc = await allocate(store, trial_id, experiment_id=1)
        await store.append(
            f"trial-{trial_id}",
            [
                TrialStarted(trial_id=trial_id, allocation_id=alloc, run_id=1, agent_id="gpu01"),
                TrialExited(trial_id=trial_id, run_id=1, allocation_id=alloc, outcome="completed"),
            ],
        )
        await asyncio.sleep(0.05)


async def test_subscriber_survives_kill_9_without_losing_or_repeating_rows(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """SIGKILL while events keep arriving, then a restart: the CSV's positions are exactly the
    usage events' positions, in order, each once."""
    out = tmp_path / "usage.csv"
    await submit_experiment(store, 1)
    first = await start(api, out)
    producer = asyncio.create_task(produce(store))
    try:
        await wait_until(lambda: len(positions(out)) >= 10, timeout=60)
        first.send_signal(signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
        seen_at_kill = len(positions(out))
        await producer
        head = await store.head()
        expected = [
            e.position for e in await store.read_all(0, limit=head + 1) if e.type in USAGE_TYPES
        ]
        assert seen_at_kill < len(expected), "the kill came after the last event"
        second = await start(api, out)
        try:
            await wait_until(lambda: len(positions(out)) >= len(expected), timeout=60)
        finally:
            second.send_signal(signal.SIGTERM)
            await second.wait()
    finally:
        producer.cancel()
        if first.returncode is None:
            first.kill()
            await first.wait()
    assert positions(out) == expected
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    allocated = [r for r in rows if r["type"] == "SlotsAllocated"]
    assert len(allocated) == TRIALS and all(r["slots"] == "1" for r in allocated)
    assert {r["outcome"] for r in rows if r["type"] == "TrialExited"} == {"completed"}


async def test_stream_filters_by_stream_id_and_stream_type(api: Api, store: EventStore) -> None:
    """``streams`` takes stream ids and stream types (combined with ``types`` by AND); a
    malformed name is a 400 naming the parameter."""
    await submit_experiment(store, 1)
    await allocate(store, 11)
    await allocate(store, 12, experiment_id=1)
    by_id = await read_events(api, api.admin, 2, query="?streams=trial-12,experiment-1")
    assert [(e["data"]["stream_id"], e["event"]) for e in by_id] == [
        ("experiment-1", "ExperimentSubmitted"),
        ("experiment-1", "TrialRequested"),
    ]
    by_type = await read_events(
        api, api.admin, 2, query="?streams=trial&types=SlotsAllocated,TrialRequested"
    )
    assert [(e["data"]["stream_id"], e["event"]) for e in by_type] == [
        ("trial-11", "SlotsAllocated"),
        ("trial-12", "SlotsAllocated"),
    ]
    resumed = await read_events(
        api, api.admin, 1, query="?streams=trial", last_event_id=int(by_type[0]["id"])
    )
    assert resumed[0]["data"]["stream_id"] == "trial-12"
    status, body = await api.call("GET", "/api/v1/events/stream?streams=Trial 1", api.admin)
    assert status == 400 and body["error"]["path"] == "streams"
