"""The job queue through the API: trials and tasks in the scheduler's order, another user's
job shown without its ids, a pool filter, and hostile input refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.domain.names import task_allocation_id, task_stream
from events.domain.types import ExperimentSubmitted, TaskAllocated, TrialRequested
from events.log.store import EventStore
from tests.integration.test_api_ownership import login
from tests.integration.test_api_support import Api, running_api


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def command(api: Api, token: str, priority: int, pool: str = "") -> str:
    resources = {"priority": priority, "resource_pool": pool}
    body = {"argv": ["python", "prep.py"], "config": {"resources": resources}}
    return str((await api.ok("POST", "/api/v1/commands", token=token, json=body))["id"])


async def test_jobs_are_listed_in_the_schedulers_order_and_hide_other_users_ids(
    api: Api, store: EventStore
) -> None:
    """A placed task leads; waiting trials and tasks follow by priority then request order;
    Bob sees Alice's jobs (owner, priority, slots) without their ids, an admin sees all."""
    alice, bob = await login(api, "alice"), await login(api, "bob")
    config = {"name": "mnist", "resources": {"slots_per_trial": 2, "priority": 30}}
    await store.append(
        "experiment-7",
        [
            ExperimentSubmitted(experiment_id=7, config=config, owner="bob"),
            TrialRequested(
                experiment_id=7, trial_id=71, seq=1, request_id="r1", hparams={}, trial_seed=1
            ),
        ],
        expected_version=0,
    )
    late = await command(api, alice, 50)
    urgent = await command(api, alice, 10)
    placed = await command(api, bob, 60)
    await store.append(
        task_stream(placed),
        [
            TaskAllocated(
                task_id=placed,
                allocation_id=task_allocation_id(placed),
                placements={"gpu01": ["0"]},
            )
        ],
        expected_version=1,
    )
    answer = await api.ok("GET", "/api/v1/job-queues", token=api.admin)
    assert [(j["position"], j["kind"], j["job_id"], j["state"]) for j in answer["jobs"]] == [
        (1, "command", placed, "ASSIGNED"),
        (2, "command", urgent, "QUEUED"),
        (3, "trial", "71", "QUEUED"),
        (4, "command", late, "QUEUED"),
    ]
    trial = answer["jobs"][2]
    assert (trial["experiment_id"], trial["name"], trial["owner"]) == (7, "mnist", "bob")
    assert (trial["slots"], trial["priority"], trial["resource_pool"]) == (2, 30, "default")
    seen_by_bob = (await api.ok("GET", "/api/v1/job-queues", token=bob))["jobs"]
    assert [(j["job_id"], j["owner"], j["priority"]) for j in seen_by_bob] == [
        (placed, "bob", 60),
        (None, "alice", 10),
        ("71", "bob", 30),
        (None, "alice", 50),
    ]
    assert all(j["name"] is None for j in seen_by_bob if j["owner"] == "alice")


async def test_the_queue_narrows_to_one_pool_and_refuses_a_hostile_pool_name(api: Api) -> None:
    """``resource_pool`` keeps that pool's jobs only; an over-long name is a 400 naming it."""
    alice = await login(api, "alice")
    gpu = await command(api, alice, 42, pool="gpu")
    await command(api, alice, 42)
    jobs = (await api.ok("GET", "/api/v1/job-queues?resource_pool=gpu", token=alice))["jobs"]
    assert [j["job_id"] for j in jobs] == [gpu]
    status, body = await api.call(
        "GET", "/api/v1/job-queues?resource_pool=" + "x" * 500, token=alice
    )
    assert status == 400 and body["error"]["path"] == "resource_pool", body
