"""What the Core API asks of the gateway beyond metrics: status and alert reports, the
experiment's best validation, and the legacy searcher operation, each with its access rule."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from cairn.core._http import Session
from cairn.core._preempt import PreemptContext
from cairn.core._reporter import HTTPReporter
from events.domain.config import parse_config
from events.domain.types import ExperimentSubmitted, TrialExited, TrialStopRequested
from events.log.store import EventStore
from tests.helpers import wait_until
from tests.integration.test_api_support import CONFIG, Api, allocate, running_api

BEST = "/api/v1/experiments/{}/searcher/best_searcher_validation_metric"


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def submit(store: EventStore, experiment_id: int, **searcher: Any) -> None:
    """Appends an ExperimentSubmitted whose searcher section is CONFIG's updated by ``searcher``."""
    raw = yaml.safe_load(CONFIG)
    raw["searcher"].update(searcher)
    config = parse_config(raw, default_seed=7).model_dump(mode="json")
    await store.append(
        f"experiment-{experiment_id}",
        [ExperimentSubmitted(experiment_id=experiment_id, config=config, owner="admin")],
    )


async def report(api: Api, trial_id: int, *items: dict[str, Any]) -> Any:
    return await api.ok(
        "POST",
        f"/api/v1/trials/{trial_id}/reports",
        token=api.trial_token(trial_id),
        json={"items": list(items)},
    )


def validation(key: str, steps: int, **values: float) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "idempotency_key": key,
        "group": "validation",
        "steps_completed": steps,
        "metrics": values,
    }


async def test_status_and_alerts_show_in_the_trial(api: Api, store: EventStore) -> None:
    """set_status's latest text and every alert (a TrialAlerted event) appear in GET /trials/{id}."""
    await submit(store, 1)
    await allocate(store, 11)
    detail = await api.ok("GET", "/api/v1/trials/11", token=api.admin)
    assert (detail["status"], detail["alerts"]) == (None, [])
    await report(
        api,
        11,
        {"kind": "status", "idempotency_key": "s1", "status": "loading data"},
        {
            "kind": "alert",
            "idempotency_key": "a1",
            "title": "slow",
            "description": "io",
            "level": "warn",
        },
        {"kind": "status", "idempotency_key": "s2", "status": "training"},
    )
    alerted = [e for e in await store.read_stream("trial-11") if e.type == "TrialAlerted"]
    assert [(e.payload["title"], e.payload["level"], e.payload["run_id"]) for e in alerted] == [
        ("slow", "warn", 1)
    ]
    detail = await api.ok("GET", "/api/v1/trials/11", token=api.admin)
    assert detail["status"] == "training"
    assert [(a["title"], a["description"], a["level"]) for a in detail["alerts"]] == [
        ("slow", "io", "warn")
    ]


async def test_bad_status_and_alert_items_are_400(api: Api, store: EventStore) -> None:
    """An oversized status or an unknown alert level is a 400 naming the field; nothing is kept."""
    await submit(store, 1)
    await allocate(store, 11)
    cases = [
        ({"kind": "status", "idempotency_key": "s", "status": "x" * 5000}, "items[0].status"),
        ({"kind": "alert", "idempotency_key": "a", "level": "panic"}, "items[0].level"),
    ]
    for item, path in cases:
        status, body = await api.call(
            "POST",
            "/api/v1/trials/11/reports",
            token=api.trial_token(11),
            json={"items": [item]},
        )
        assert status == 400 and body["error"]["path"] == path, body
    assert [e.type for e in await store.read_stream("trial-11")] == ["SlotsAllocated"]


async def test_best_validation_follows_smaller_is_better_across_trials(
    api: Api, store: EventStore
) -> None:
    """The best searcher metric over every trial's validations, read from the log (a report
    just made counts at once), min or max by smaller_is_better; null before any."""
    await submit(store, 1)  # metric loss, smaller is better
    await submit(store, 2, metric="accuracy", smaller_is_better=False)
    for trial_id in (11, 12, 21, 22):
        await allocate(store, trial_id)
    token = api.trial_token(11)
    assert (await api.ok("GET", BEST.format(1), token=token))["metric"] is None
    await report(api, 11, validation("v1", 10, loss=0.5), validation("v2", 20, loss=0.4))
    await report(api, 12, validation("v1", 10, loss=0.3, accuracy=0.99))
    await report(api, 12, validation("v2", 20, other=0.0))
    best = await api.ok("GET", BEST.format(1), token=token)
    assert best == {
        "metric": 0.3,
        "trial_id": 12,
        "searcher_metric": "loss",
        "smaller_is_better": True,
    }
    await report(api, 21, validation("v1", 10, accuracy=0.7))
    await report(api, 22, validation("v1", 10, accuracy=0.9), validation("v2", 20, accuracy=0.8))
    best = await api.ok("GET", BEST.format(2), token=api.trial_token(21))
    assert (best["metric"], best["trial_id"], best["smaller_is_better"]) == (0.9, 22, False)
    assert (await api.ok("GET", BEST.format(2), token=api.admin))["metric"] == 0.9


async def test_best_validation_is_closed_to_other_experiments_trials(
    api: Api, store: EventStore
) -> None:
    """A trial token reads only its own experiment's best validation (403), another user none
    (403); an unknown experiment is a 404."""
    await submit(store, 1)
    await submit(store, 2)
    await allocate(store, 21)
    status, body = await api.call("GET", BEST.format(1), token=api.trial_token(21))
    assert status == 403, body
    await api.ok(
        "POST",
        "/api/v1/users",
        token=api.admin,
        json={"username": "mallory", "password": "mallory-pw"},
    )
    status, body = await api.call(
        "GET", BEST.format(1), token=await api.login("mallory", "mallory-pw")
    )
    assert status == 403, body
    status, _ = await api.call("GET", BEST.format(99), token=api.admin)
    assert status == 404
    status, _ = await api.call("GET", BEST.format("x1"), token=api.admin)
    assert status == 404


async def test_searcher_operation_is_the_length_until_the_searcher_stops_the_trial(
    api: Api, store: EventStore
) -> None:
    """A trial's operation is the config's searcher length; after TrialStopRequested (ASHA) the
    trial has no operation left; another trial's token may not ask."""
    await submit(store, 1)
    await allocate(store, 11)
    await allocate(store, 12)
    path = "/api/v1/trials/11/searcher/operation"
    answer = await api.ok("GET", path, token=api.trial_token(11))
    assert answer == {"completed": False, "length": 100, "unit": "batches"}
    status, _ = await api.call("GET", path, token=api.trial_token(12))
    assert status == 403
    await store.append(
        "experiment-1",
        [TrialStopRequested(experiment_id=1, trial_id=12, request_id="r-12")],
    )
    assert not (await api.ok("GET", path, token=api.trial_token(11)))["completed"]
    await store.append(
        "experiment-1",
        [TrialStopRequested(experiment_id=1, trial_id=11, request_id="r-11")],
    )
    answer = await api.ok("GET", path, token=api.trial_token(11))
    assert answer == {"completed": True, "length": None, "unit": "batches"}


async def lost_run(store: EventStore) -> str:
    """Trial 11 whose first run the scheduler declared lost; returns its allocation id."""
    await submit(store, 1)
    allocation = await allocate(store, 11)
    lost = TrialExited(trial_id=11, run_id=1, allocation_id=allocation, outcome="lost")
    await store.append("trial-11", [lost])
    return allocation


async def test_reporter_of_a_run_no_longer_current_gives_up_its_process(
    api: Api, store: EventStore
) -> None:
    """A report from a run declared lost is refused (its token: 403, run_not_current); the Core
    API's reporter then calls its run-gone handler once with the API's reason and drops the rest,
    rather than dropping item after item while training goes on."""
    allocation = await lost_run(store)
    gone: list[str] = []
    session = Session(api.url, api.trial_token(11))
    reporter = HTTPReporter(session, 11, allocation, flush_every=0.05, on_run_gone=gone.append)
    metrics = {"kind": "metrics", "group": "training", "metrics": {"loss": 1.0}, "run_id": 1}
    try:
        for steps in (1, 2, 3):
            reporter.submit({**metrics, "steps_completed": steps})
        await wait_until(lambda: gone, timeout=20)
    finally:
        reporter.close(timeout=1.0)
    assert len(gone) == 1 and "run 1 of trial 11" in gone[0] and "current run" in gone[0]
    assert reporter.run_gone and reporter.delivered == 0
    assert not [e for e in await store.read_stream("trial-11") if e.type == "WorkloadCompleted"]


async def test_preemption_watcher_of_a_run_no_longer_current_gives_up_its_process(
    api: Api, store: EventStore
) -> None:
    """The preemption watcher of a run declared lost learns it from the long poll (its token
    refused: 403, run_not_current) and calls the run-gone handler, naming the run."""
    allocation = await lost_run(store)
    gone: list[str] = []
    session = Session(api.url, api.trial_token(11))
    watcher = PreemptContext(session, allocation, on_run_gone=gone.append)
    watcher.start()
    try:
        await wait_until(lambda: gone, timeout=20)
    finally:
        watcher.close()
    assert len(gone) == 1 and "run 1 of trial 11" in gone[0], (allocation, gone)
    assert watcher.should_preempt()
