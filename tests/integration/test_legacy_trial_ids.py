"""A log written before trial ids were integers ("7.1") replays through every fold unchanged.

The log is made of the old schema versions' fixtures (``tests/fixtures/events/*.v1.json`` and
the like), inserted as stored rows, so nothing current rewrites them on the way in.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from pathlib import Path
from typing import Any

from events.domain.aggregates import fold_trial
from events.domain.check import check_log
from events.domain.config import parse_config
from events.domain.names import allocation_id, trial_stream
from events.domain.search import make_method
from events.log import migrations
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
from services.api import tables
from services.api.auth import sign_trial_token
from services.scheduler.state import ClusterState
from services.searcher.service import SearcherConsumer
from services.tracker import schema as tracker_schema
from services.tracker.service import catch_up
from tests.integration.test_api_support import CONFIG, running_api

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "events"
LEGACY = -7_000_001
"""Trial "7.1" of the old log, as the upcasters number it."""


def fixture(event_type: str, version: int, **changes: Any) -> tuple[str, int, dict[str, Any]]:
    payload = json.loads((FIXTURES / f"{event_type}.v{version}.json").read_text())
    return event_type, version, {**payload, **changes}


async def insert(store: EventStore, stream_id: str, *rows: tuple[str, int, dict[str, Any]]) -> None:
    """Stores rows as an old cairn wrote them: type, old schema version and old payload."""
    async with store.connection() as conn:
        version = await conn.fetchval(
            "SELECT coalesce(max(stream_version), 0) FROM events WHERE stream_id = $1", stream_id
        )
        for event_type, schema_version, payload in rows:
            version += 1
            await conn.execute(
                """INSERT INTO events (stream_id, stream_version, event_id, type, schema_version,
                                       payload)
                   VALUES ($1, $2, $3, $4, $5, $6)""",
                stream_id,
                version,
                uuid.uuid4(),
                event_type,
                schema_version,
                payload,
            )


async def legacy_log(store: EventStore) -> dict[str, Any]:
    """Experiment 7 with one trial "7.1" that ran once and completed, in old payloads only."""
    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    request_id = make_method(parse_config(config)).initial_operations()[0].request_id  # type: ignore[attr-defined]
    await insert(store, "agent-agent-a", fixture("AgentRegistered", 1))
    submitted = ("ExperimentSubmitted", 1, {"experiment_id": 7, "config": config, "owner": "admin"})
    requested = fixture("TrialRequested", 1, request_id=request_id)
    await insert(store, "experiment-7", submitted, requested)
    alloc = {"allocation_id": "7.1.1"}
    await insert(
        store,
        "trial-7.1",
        fixture("SlotsAllocated", 1, **alloc, placements={"agent-a": ["0"]}),
        fixture("TrialStarted", 1, **alloc),
    )
    # The old searcher had decided the trial: its checkpoint is past its inputs.
    async with store.transaction() as tx:
        await tx.set_checkpoint("searcher", await store.head())
    return config


async def restarted_searcher(store: EventStore) -> SearcherConsumer:
    """A searcher process started on the log: it replays up to its checkpoint, then runs."""
    searcher = SearcherConsumer(store)
    await searcher.rebuild()
    await ConsumerRunner(store, None, searcher).catch_up()
    return searcher


async def finish_legacy_trial(store: EventStore) -> None:
    alloc = {"allocation_id": "7.1.1"}
    await insert(
        store,
        "trial-7.1",
        fixture("WorkloadCompleted", 1),
        fixture("ValidationReported", 1, metrics={"loss": 0.4}),
        fixture("CheckpointSaved", 1),
        fixture("TrialExited", 1, **alloc, failed=False, exit_code=0),
        fixture("SlotsReleased", 1, **alloc, placements={"agent-a": ["0"]}),
        fixture("TrialStateChanged", 1, state="COMPLETED", reason="done"),
    )


async def fold_cluster(store: EventStore) -> ClusterState:
    state = ClusterState()
    async for event in store.iter_all(0):
        state.apply(event)
    return state


async def test_legacy_log_folds_into_the_same_trials(store: EventStore) -> None:
    """Old "7.1" payloads fold in the scheduler, searcher, tracker and lifecycle as trial
    -7000001, whose stream and allocations keep their old names."""
    await legacy_log(store)
    assert trial_stream(LEGACY) == "trial-7.1" and allocation_id(LEGACY, 1) == "7.1.1"

    running = await fold_cluster(store)
    assert list(running.trials) == [LEGACY]
    assert list(running.experiments[7].trials) == [LEGACY]
    found = running.run_of("7.1.1")
    assert found is not None and found[0].trial_id == LEGACY and found[1].started

    await finish_legacy_trial(store)
    done = await fold_cluster(store)
    assert done.trials[LEGACY].state == "COMPLETED" and not done.trials[LEGACY].running
    assert fold_trial(0, await store.read_stream("trial-7.1")).state == "COMPLETED"

    # The searcher maps the legacy trial to its request: its closing ends the single search.
    searcher = await restarted_searcher(store)
    assert searcher.experiment_of == {LEGACY: 7}
    experiment = await store.read_stream("experiment-7")
    assert [e.type for e in experiment][1:] == ["TrialRequested", "ExperimentStateChanged"]
    assert experiment[-1].payload["state"] == "STOPPING_COMPLETED"

    await catch_up(store)
    trial = await store.fetchrow(
        "SELECT trial_id, seq, state, steps_completed, latest_checkpoint FROM tr_trials"
    )
    assert dict(trial) == {
        "trial_id": LEGACY,
        "seq": 1,
        "state": "COMPLETED",
        "steps_completed": 100,
        "latest_checkpoint": "0b7e-1",
    }
    allocations = await store.fetch("SELECT allocation_id, trial_id FROM tr_allocations")
    assert [tuple(r) for r in allocations] == [("7.1.1", LEGACY)]
    metrics = await store.fetch('SELECT DISTINCT trial_id, "group" FROM tr_metrics ORDER BY 2')
    assert [tuple(r) for r in metrics] == [(LEGACY, "training"), (LEGACY, "validation")]
    assert await check_log(store) == []


async def test_new_trials_after_legacy_ones_take_fresh_ids(store: EventStore) -> None:
    """A searcher replaying a legacy log learns its trials from the log and takes the next
    experiment's trial ids from the sequence: positive integers, never a legacy id."""
    await legacy_log(store)
    await finish_legacy_trial(store)
    await restarted_searcher(store)
    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    await insert(
        store, "experiment-8", ("ExperimentSubmitted", 1, {"experiment_id": 8, "config": config})
    )
    searcher = await restarted_searcher(store)
    requested = [
        e.payload for e in await store.read_stream("experiment-8") if e.type == "TrialRequested"
    ]
    assert len(requested) == 1 and requested[0]["trial_id"] == 1 and requested[0]["seq"] == 1
    assert searcher.experiment_of == {LEGACY: 7, requested[0]["trial_id"]: 8}


async def test_gateway_serves_legacy_trials_and_refuses_their_old_tokens(
    store: EventStore,
) -> None:
    """``/api/v1/trials/-7000001`` and ``/api/v1/trials/7.1`` name the legacy trial; a token of
    the old form (no run) is refused (401), and one of its run, which has ended, is 403."""
    await legacy_log(store)
    await finish_legacy_trial(store)
    await catch_up(store)
    async with running_api(store) as api:
        old_token = "trial:7.1:" + hmac.new(api.secret, b"trial:7.1", hashlib.sha256).hexdigest()
        run_token = sign_trial_token(api.secret, LEGACY, 1)
        assert run_token.startswith("trial:7.1:1:")
        for path in ("/api/v1/trials/-7000001", "/api/v1/trials/7.1"):
            trial = await api.ok("GET", path, token=api.admin)
            assert (trial["trial_id"], trial["experiment_id"], trial["seq"]) == (LEGACY, 7, 1)
            assert [a["allocation_id"] for a in trial["allocations"]] == ["7.1.1"]
        metrics = await api.ok("GET", f"/api/v1/trials/{LEGACY}/metrics", token=api.admin)
        assert metrics["trial_id"] == LEGACY and len(metrics["metrics"]) == 2
        status, _ = await api.call("GET", "/api/v1/me", token=old_token)
        assert status == 401
        status, body = await api.call("GET", "/api/v1/me", token=run_token)
        assert status == 403 and body["error"]["reason"] == "run_not_current", body


async def test_tables_of_text_trial_ids_are_migrated_to_the_same_integers(
    store: EventStore,
) -> None:
    """Rows written under text ids ("7.1", and "17") hold the integers the upcasters give."""
    async with store.connection() as conn:
        await migrations.apply(conn, tracker_schema.NAMESPACE, tracker_schema.MIGRATIONS[:1])
        await migrations.apply(conn, tables.NAMESPACE, tables.MIGRATIONS[:7])
        await conn.execute(
            """INSERT INTO tr_trials (trial_id, experiment_id, seq, state, requested_at)
               VALUES ('7.1', 7, 1, 'ACTIVE', now()), ('17', 8, 1, 'ACTIVE', now());
               INSERT INTO trial_progress (trial_id, progress) VALUES ('7.1', 0.5);"""
        )
    await tables.migrate(store)
    await tracker_schema.migrate(store)
    trials = await store.fetch("SELECT trial_id FROM tr_trials ORDER BY trial_id")
    assert [r["trial_id"] for r in trials] == [LEGACY, 17]
    assert await store.fetchval("SELECT trial_id FROM trial_progress") == LEGACY
