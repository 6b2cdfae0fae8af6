"""Trial reports through the API gateway: batched metrics, checkpoints, progress, early exit,
idempotency and Determined-style metric rollback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from events.log.store import EventStore
from services.tracker.service import catch_up
from tests.integration.test_api_support import (
    Api,
    allocate,
    running_api,
    submit_experiment,
    types_of,
)


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


def metrics(key: str, group: str, steps: int, run_id: int = 1, **values: Any) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "idempotency_key": key,
        "group": group,
        "steps_completed": steps,
        "run_id": run_id,
        "metrics": values or {"loss": 1.0 / (abs(steps) + 1)},
    }


async def report(api: Api, trial_id: int, *items: dict[str, Any], run_id: int = 1) -> Any:
    return await api.ok(
        "POST",
        f"/api/v1/trials/{trial_id}/reports",
        token=api.trial_token(trial_id, run_id),
        json={"items": list(items)},
    )


async def test_metrics_batch_is_idempotent(api: Api, store: EventStore) -> None:
    """A batch becomes events once (every group, numbers only) and a projected series; repeats change nothing."""
    await submit_experiment(store)
    await allocate(store, 11)
    batch = [
        metrics("m1", "training", 10),
        metrics("m2", "training", 20),
        metrics("m3", "validation", 20, accuracy=0.9, note="text", bad=float("nan")),
        metrics("m4", "custom", 20, x=1),
        {"kind": "progress", "idempotency_key": "p1", "progress": 0.2},
    ]
    assert await report(api, 11, *batch) == {"accepted": 5, "duplicates": 0, "events": 4}
    assert await report(api, 11, *batch) == {"accepted": 0, "duplicates": 5, "events": 0}
    events = await store.read_stream("trial-11")
    assert [e.type for e in events] == [
        "SlotsAllocated",
        "WorkloadCompleted",
        "WorkloadCompleted",
        "ValidationReported",
        "MetricsReported",
    ]
    assert events[3].payload["metrics"] == {"accuracy": 0.9}
    assert (events[4].payload["group"], events[4].payload["metrics"]) == ("custom", {"x": 1.0})
    await catch_up(store)
    series = await api.ok("GET", "/api/v1/trials/11/metrics", token=api.admin)
    assert len(series["metrics"]) == 4
    validation = await api.ok("GET", "/api/v1/trials/11/metrics?group=validation", token=api.admin)
    assert validation["metrics"][0]["metrics"] == {"accuracy": 0.9}
    progress = await store.fetchval("SELECT progress FROM trial_progress WHERE trial_id = 11")
    assert progress == 0.2


async def test_checkpoint_requires_metadata_steps_completed(api: Api, store: EventStore) -> None:
    """A checkpoint without metadata.steps_completed is a 400 naming that path; with it, a
    CheckpointSaved is appended."""
    await submit_experiment(store)
    await allocate(store, 11)
    uuid = api.checkpoint_uuid(11)
    item = {
        "kind": "checkpoint",
        "idempotency_key": "c1",
        "uuid": uuid,
        "run_id": 1,
        "metadata": {},
    }
    status, body = await api.call(
        "POST", "/api/v1/trials/11/reports", token=api.trial_token(11), json={"items": [item]}
    )
    assert status == 400
    assert body["error"]["path"] == "items[0].metadata.steps_completed"
    item["metadata"] = {"steps_completed": 40, "framework": "torch"}
    item["resources"] = {"model.pt": 123}
    assert (await report(api, 11, item))["events"] == 1
    saved = (await store.read_stream("trial-11"))[-1]
    assert saved.type == "CheckpointSaved"
    assert (saved.payload["uuid"], saved.payload["steps_completed"]) == (uuid, 40)


async def test_invalid_items_are_400_with_their_path(api: Api, store: EventStore) -> None:
    """Malformed report items are refused with a 400 that names the item and field."""
    await submit_experiment(store)
    await allocate(store, 11)
    cases = [
        ({"items": [{"kind": "bogus", "idempotency_key": "k"}]}, "items[0].kind"),
        ({"items": [metrics("k", "training", -1)]}, "items[0].steps_completed"),
        (
            {"items": [{"kind": "progress", "idempotency_key": "k", "progress": 2}]},
            "items[0].progress",
        ),
        ({"items": "nope"}, "items"),
    ]
    for body, path in cases:
        status, answer = await api.call(
            "POST", "/api/v1/trials/11/reports", token=api.trial_token(11), json=body
        )
        assert status == 400 and answer["error"]["path"] == path, answer
    status, _ = await api.call(
        "POST",
        "/api/v1/trials/99/reports",
        token=api.admin,
        json={"items": [metrics("k", "x", 1)]},
    )
    assert status == 404


async def test_new_run_archives_later_steps_of_earlier_runs(api: Api, store: EventStore) -> None:
    """When run 2 reports at step s, run 1's rows beyond s (all groups) are archived."""
    await submit_experiment(store)
    await allocate(store, 11)
    await report(
        api,
        11,
        *(metrics(f"a{s}", "training", s) for s in (10, 20, 30)),
        metrics("v30", "validation", 30),
    )
    await allocate(store, 11, run_id=2, request=False)
    await report(api, 11, metrics("b20", "training", 20, run_id=2), run_id=2)
    await catch_up(store)
    rows = await store.fetch(
        'SELECT run_id, "group", steps_completed, archived FROM tr_metrics ORDER BY 2, 3, 1'
    )
    archived = {(r["run_id"], r["group"], r["steps_completed"]) for r in rows if r["archived"]}
    assert archived == {(1, "training", 30), (1, "validation", 30)}
    current = await api.ok("GET", "/api/v1/trials/11/metrics?group=training", token=api.admin)
    assert [(m["run_id"], m["steps_completed"]) for m in current["metrics"]] == [
        (1, 10),
        (1, 20),
        (2, 20),
    ]
    everything = await api.ok(
        "GET", "/api/v1/trials/11/metrics?group=training&archived=true", token=api.admin
    )
    assert len(everything["metrics"]) == 4


async def test_max_points_downsamples_each_series_keeping_ends(api: Api, store: EventStore) -> None:
    """max_points keeps that many evenly spaced points per (group, run), first and last included."""
    await submit_experiment(store)
    await allocate(store, 11)
    await report(
        api,
        11,
        *(metrics(f"t{s}", "training", s) for s in range(1, 11)),
        *(metrics(f"v{s}", "validation", s) for s in (5, 10)),
    )
    await catch_up(store)

    async def steps(query: str) -> dict[str, list[int]]:
        body = await api.ok("GET", f"/api/v1/trials/11/metrics?{query}", token=api.admin)
        out: dict[str, list[int]] = {}
        for m in body["metrics"]:
            out.setdefault(m["group"], []).append(m["steps_completed"])
        return out

    assert await steps("max_points=4") == {"training": [1, 4, 7, 10], "validation": [5, 10]}
    assert await steps("max_points=3&group=training") == {"training": [1, 5, 10]}
    assert await steps("max_points=2&group=training") == {"training": [1, 10]}
    assert await steps("max_points=1&group=training") == {"training": [10]}
    assert len((await steps("max_points=100000"))["training"]) == 10
    for bad in ("0", "100001", "x"):
        status, body = await api.call(
            "GET", f"/api/v1/trials/11/metrics?max_points={bad}", token=api.admin
        )
        assert status == 400, body


async def test_early_exit_and_default_run_id(api: Api, store: EventStore) -> None:
    """early_exit appends TrialEarlyExited; metrics without run_id use the latest allocation's run."""
    await submit_experiment(store)
    await allocate(store, 11)
    await allocate(store, 11, run_id=2, request=False)
    item = metrics("m", "training", 5)
    del item["run_id"]
    await report(
        api,
        11,
        item,
        {"kind": "early_exit", "idempotency_key": "e", "reason": "INVALID_HP"},
        run_id=2,
    )
    events = await store.read_stream("trial-11")
    assert events[-2].payload["run_id"] == 2
    assert events[-1].type == "TrialEarlyExited" and events[-1].payload["reason"] == "invalid_hp"
    assert await types_of(store, "trial-11") == [
        "SlotsAllocated",
        "SlotsAllocated",
        "WorkloadCompleted",
        "TrialEarlyExited",
    ]
