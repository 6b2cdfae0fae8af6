"""Reading another service's tables through its owner's read module: the gateway answers before
the tracker has created its tables, combines the tracker's rows with its own telemetry, and the
scheduler reads heartbeats inside its transaction through the gateway's read module."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.domain.types import ExperimentStateChanged
from events.log.store import EventStore
from services.api import read as api_read
from services.api import tables
from services.tracker.service import catch_up
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def _exists(store: EventStore, table: str) -> bool:
    return bool(await store.fetchval("SELECT to_regclass($1) IS NOT NULL", table))


async def progress(api: Api, trial_id: int, value: float) -> None:
    """Reports ``value`` as the trial's progress, with the trial's own token."""
    await api.ok(
        "POST",
        f"/api/v1/trials/{trial_id}/reports",
        token=api.trial_token(trial_id),
        json={"items": [{"kind": "progress", "idempotency_key": "p", "progress": value}]},
    )


async def test_gateway_reads_nothing_before_the_tracker_made_its_tables(
    api: Api, store: EventStore
) -> None:
    """The gateway migrates only its own tables; until the tracker has run, every projection
    read answers empty (200), and the same reads see the rows once the tracker caught up."""
    await submit_experiment(store, 1)
    await allocate(store, 11)
    assert await _exists(store, "api_users")
    assert not await _exists(store, "tr_experiments")
    assert not await _exists(store, "audit_trail")

    listed = await api.ok("GET", "/api/v1/experiments", token=api.admin)
    assert listed["experiments"] == [] and listed["pagination"]["total"] == 0
    assert (await api.ok("GET", "/api/v1/agents", token=api.admin))["agents"] == []
    assert (await api.ok("GET", "/api/v1/cluster/queue", token=api.admin))["queue"] == []
    assert (await api.ok("GET", "/api/v1/cluster/allocations", token=api.admin)) == {
        "allocations": []
    }
    assert (await api.ok("GET", "/api/v1/audit", token=api.admin))["entries"] == []
    assert (await api.ok("GET", "/api/v1/trials/11/metrics", token=api.admin))["metrics"] == []

    await catch_up(store)
    assert await _exists(store, "tr_experiments")
    listed = await api.ok("GET", "/api/v1/experiments", token=api.admin)
    assert [e["id"] for e in listed["experiments"]] == [1]
    held = await api.ok("GET", "/api/v1/cluster/allocations", token=api.admin)
    assert [a["trial_id"] for a in held["allocations"]] == [11]
    assert (await api.ok("GET", "/api/v1/audit", token=api.admin))["entries"] != []


async def test_experiment_progress_combines_tracker_trials_with_reported_progress(
    api: Api, store: EventStore
) -> None:
    """An experiment's progress is the mean of what its trials reported (the gateway's table)
    over its trials (the tracker's), null when none reported, 1 once COMPLETED, in the list
    and in one experiment's summary alike."""
    for experiment_id in (1, 2, 3):
        await submit_experiment(store, experiment_id)
    await allocate(store, 11)
    await allocate(store, 12)
    await allocate(store, 13)
    await allocate(store, 21)
    await allocate(store, 31)
    await progress(api, 11, 0.2)
    await progress(api, 12, 0.8)
    await progress(api, 31, 0.1)
    await store.append(
        "experiment-3",
        [
            ExperimentStateChanged(experiment_id=3, state=state)
            for state in ("STOPPING_COMPLETED", "COMPLETED")
        ],
    )
    await catch_up(store)

    listed = await api.ok("GET", "/api/v1/experiments?limit=10", token=api.admin)
    by_id = {e["id"]: e["progress"] for e in listed["experiments"]}
    assert by_id == {1: pytest.approx(0.5), 2: None, 3: 1.0}
    for experiment_id, expected in by_id.items():
        one = await api.ok("GET", f"/api/v1/experiments/{experiment_id}", token=api.admin)
        assert one["progress"] == expected


async def test_agent_list_shows_the_gateway_heartbeat_beside_the_tracker_agent(
    api: Api, store: EventStore
) -> None:
    """An agent's ``last_heartbeat`` comes from the gateway's heartbeats, its slots and state
    from the tracker's projection; an agent that never beat shows null."""
    slots = [{"slot_id": "0", "device": "cpu", "name": "cpu-0"}]
    for agent_id in ("beats", "silent"):
        await api.ok(
            "POST",
            f"/api/v1/agents/{agent_id}/register",
            token=await api.agent_token(agent_id),
            json={"slots": slots, "incarnation": f"inc-{agent_id}"},
        )
    await store.execute("DELETE FROM agent_heartbeats WHERE agent_id = 'silent'")
    await catch_up(store)
    agents = {
        a["agent_id"]: a for a in (await api.ok("GET", "/api/v1/agents", api.admin))["agents"]
    }
    assert agents["beats"]["last_heartbeat"] is not None
    assert agents["silent"]["last_heartbeat"] is None
    assert [s["slot_id"] for s in agents["beats"]["slots"]] == ["0"]


async def test_heartbeats_read_in_a_transaction_without_their_table(store: EventStore) -> None:
    """Before the gateway made its table the read answers None and leaves the caller's
    transaction usable; afterwards it gives each agent's beat and running list."""
    assert not await _exists(store, "agent_heartbeats")
    async with store.connection() as conn, conn.transaction():
        assert await api_read.heartbeats(conn) is None
        assert await conn.fetchval("SELECT 1") == 1

    await tables.migrate(store)
    await store.execute(
        """INSERT INTO agent_heartbeats (agent_id, running, incarnation, seq)
           VALUES ('a1', '["alloc-1"]', 'i1', 3)"""
    )
    async with store.connection() as conn, conn.transaction():
        beats = await api_read.heartbeats(conn)
    assert beats is not None and set(beats.agents) == {"a1"}
    beat = beats.agents["a1"]
    assert (beat.incarnation, beat.seq, beat.running) == ("i1", 3, frozenset({"alloc-1"}))
    assert beat.at <= beats.now
