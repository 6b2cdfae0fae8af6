"""The web UI's API over real HTTP: downsampled series (experiment and trial), experiment logs,
the cluster queue and holders, and the UI's own files. Facts go into the log; ``catch_up``
projects them before reading."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.domain.names import trial_stream
from events.domain.types import (
    ExperimentStateChanged,
    TrialRequested,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.store import EventStore
from services.api.auth import create_user
from services.tracker.service import catch_up
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment

POINTS = 500
SPIKE_STEP, SPIKE = 137, 50.0
DIP_STEP, DIP = 311, -5.0


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


def loss(step: int) -> float:
    """A decreasing curve with one spike and one dip."""
    if step == SPIKE_STEP:
        return SPIKE
    if step == DIP_STEP:
        return DIP
    return 1.0 / (1.0 + 0.01 * step)


async def experiment_with_curves(store: EventStore, owner: str = "admin") -> None:
    """Experiment 1 with trials 11 and 12, each validated at steps 1..POINTS."""
    await submit_experiment(store, 1, owner=owner)
    for seq in (1, 2):
        trial_id = 10 + seq
        await store.append(
            "experiment-1",
            [
                TrialRequested(
                    experiment_id=1,
                    trial_id=trial_id,
                    seq=seq,
                    request_id=f"r{seq}",
                    hparams={"lr": 0.1 * seq},
                    trial_seed=seq,
                )
            ],
        )
        await store.append(
            trial_stream(trial_id),
            [
                ValidationReported(
                    trial_id=trial_id, run_id=1, steps_completed=s, metrics={"loss": loss(s) * seq}
                )
                for s in range(1, POINTS + 1)
            ]
            + [
                WorkloadCompleted(
                    trial_id=trial_id, run_id=1, steps_completed=s, metrics={"loss": 2.0, "lr": 0.1}
                )
                for s in range(10, POINTS + 1, 10)
            ],
        )
    await catch_up(store)


async def test_experiment_series_is_downsampled_keeping_extremes_and_ends(
    api: Api, store: EventStore
) -> None:
    """Each trial's series shrinks to at most 2 points per bucket, in step order, spanning the
    first to the last step and keeping the spike and the dip (every value is a reported one);
    ``position`` covers the projected events."""
    await experiment_with_curves(store)
    body = await api.ok(
        "GET", "/api/v1/experiments/1/series?metric=loss&group=validation&buckets=20", api.admin
    )
    assert body["metric"] == "loss" and body["buckets"] == 20
    assert body["position"] == await store.head()
    assert body["metrics"]["validation"] == ["loss"]
    assert sorted(body["metrics"]["training"]) == ["loss", "lr"]
    by_trial = {t["trial_id"]: t for t in body["trials"]}
    assert sorted(by_trial) == [11, 12]
    for seq, trial in ((1, by_trial[11]), (2, by_trial[12])):
        steps, values = trial["steps"], trial["values"]
        assert len(steps) <= 2 * 20 < POINTS
        assert steps == sorted(set(steps))
        assert steps[0] == 1 and steps[-1] == POINTS
        assert SPIKE * seq in values and DIP * seq in values
        reported = {loss(s) * seq for s in range(1, POINTS + 1)}
        assert set(values) <= reported
    # The default metric is the searcher's ("loss" in the test config); group defaults to
    # validation; a metric nobody reported gives no series.
    default = await api.ok("GET", "/api/v1/experiments/1/series", api.admin)
    assert default["metric"] == "loss" and len(default["trials"]) == 2
    none = await api.ok("GET", "/api/v1/experiments/1/series?metric=nope", api.admin)
    assert none["trials"] == []


async def test_trial_series_has_every_metric_of_every_group(api: Api, store: EventStore) -> None:
    """A trial's series lists each (group, metric) once, downsampled the same way."""
    await experiment_with_curves(store)
    body = await api.ok("GET", "/api/v1/trials/12/series?buckets=16", api.admin)
    keys = sorted((s["group"], s["metric"]) for s in body["series"])
    assert keys == [("training", "loss"), ("training", "lr"), ("validation", "loss")]
    validation = next(s for s in body["series"] if s["group"] == "validation")
    assert len(validation["steps"]) <= 32
    assert SPIKE * 2 in validation["values"] and DIP * 2 in validation["values"]


async def test_series_logs_and_hidden_from_other_users(api: Api, store: EventStore) -> None:
    """Another user gets 403 on the series and logs of an experiment that is not theirs;
    unknown ids are 404; malformed queries are 400."""
    await experiment_with_curves(store)
    assert await create_user(store, "bob", "pw", admin=False)
    bob = await api.login("bob", "pw")
    for path in (
        "/api/v1/experiments/1/series",
        "/api/v1/experiments/1/logs",
        "/api/v1/trials/11/series",
    ):
        status, body = await api.call("GET", path, bob)
        assert status == 403, (path, body)
    for path in ("/api/v1/experiments/9/series", "/api/v1/trials/91/series"):
        status, _ = await api.call("GET", path, api.admin)
        assert status == 404, path
    for path in (
        "/api/v1/experiments/1/series?buckets=0",
        "/api/v1/experiments/1/series?group=",
        "/api/v1/experiments/abc/series",
        "/api/v1/experiments/1/logs?limit=999999",
    ):
        status, body = await api.call("GET", path, api.admin)
        assert status == 400, (path, body)


async def test_experiment_logs_merge_its_trials_only(api: Api, store: EventStore) -> None:
    """The experiment's logs hold its trials' lines in id order, and no other experiment's."""
    await experiment_with_curves(store)
    await submit_experiment(store, 2)
    alloc_1 = await allocate(store, 11, request=False)
    alloc_2 = await allocate(store, 21)
    await catch_up(store)
    for alloc, trial_id, text in ((alloc_1, 11, "one"), (alloc_2, 21, "two")):
        status, body = await api.call(
            "POST",
            f"/api/v1/allocations/{alloc}/logs",
            api.agent,
            json={
                "idempotency_key": f"k-{trial_id}",
                "lines": [{"ts": "2026-01-01T00:00:00Z", "rank": 0, "stream": "stdout",
                           "line": f"{text} {i}"} for i in range(3)],
            },
        )  # fmt: skip
        assert status == 200, body
    body = await api.ok("GET", "/api/v1/experiments/1/logs", api.admin)
    assert [e["line"] for e in body["logs"]] == ["one 0", "one 1", "one 2"]
    assert {e["trial_id"] for e in body["logs"]} == {11}
    tail = await api.ok("GET", "/api/v1/experiments/1/logs?tail=1", api.admin)
    assert [e["line"] for e in tail["logs"]] == ["one 2"]
    after = await api.ok(
        "GET", f"/api/v1/experiments/1/logs?after_id={body['next_after_id']}", api.admin
    )
    assert after["logs"] == []


async def test_queue_and_holders_name_others_work_only_to_admins(
    api: Api, store: EventStore
) -> None:
    """Waiting trials come in request order with positions; a user sees another user's
    waiting trial and allocation without its ids, an admin with them."""
    await submit_experiment(store, 1, owner="bob")
    await store.append("experiment-1", [ExperimentStateChanged(experiment_id=1, state="ACTIVE")])
    await allocate(store, 11)
    await store.append(
        "experiment-1",
        [
            TrialRequested(
                experiment_id=1, trial_id=12, seq=2, request_id="r2", hparams={}, trial_seed=2
            )
        ],
    )
    await catch_up(store)
    assert await create_user(store, "carol", "pw", admin=False)
    carol = await api.login("carol", "pw")
    admin_queue = await api.ok("GET", "/api/v1/cluster/queue", api.admin)
    assert [(q["position"], q["trial_id"]) for q in admin_queue["queue"]] == [(1, 12)]
    carol_queue = await api.ok("GET", "/api/v1/cluster/queue", carol)
    assert [(q["trial_id"], q["experiment_id"], q["owner"]) for q in carol_queue["queue"]] == [
        (None, None, "bob")
    ]
    held = await api.ok("GET", "/api/v1/cluster/allocations", api.admin)
    assert [a["trial_id"] for a in held["allocations"]] == [11]
    hidden = await api.ok("GET", "/api/v1/cluster/allocations", carol)
    assert [a["trial_id"] for a in hidden["allocations"]] == [None]
    util = await api.ok("GET", "/api/v1/cluster/utilisation?minutes=5", carol)
    assert len(util["busy"]) == len(util["minutes"]) == 6


async def test_web_ui_files_are_public_confined_and_undocumented(api: Api) -> None:
    """``/`` and ``/ui/...`` serve the page and its modules without a token, refuse paths
    outside the web directory, and stay out of the OpenAPI document."""
    status, page = await api.call("GET", "/")
    assert status == 200 and b'src="/ui/js/main.js"' in page
    async with api.session.get(api.url + "/ui/js/main.js") as resp:
        assert resp.status == 200
        assert resp.content_type == "text/javascript"
    for bad in (
        "/ui/../routes_webui.py",
        "/ui/%2e%2e/routes_webui.py",
        "/ui/js/../../app.py",
        "/ui/.hidden",
        "/ui/js/nothing.js",
        "/ui/js",
    ):
        status, _ = await api.call("GET", bad)
        assert status == 404, bad
    doc = await api.ok("GET", "/api/v1/openapi.json", api.admin)
    assert "/" not in doc["paths"] and not any(p.startswith("/ui") for p in doc["paths"])
    assert "/api/v1/experiments/{experiment_id}/series" in doc["paths"]
