"""A cloned trial's first run starts from its parent's checkpoint, through the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from events.domain.names import experiment_stream
from events.domain.types import CheckpointSaved, TrialRequested
from events.log.store import EventStore
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def test_clone_spec_and_start_name_the_parents_checkpoint(
    api: Api, store: EventStore
) -> None:
    """A clone's spec carries its warm-start checkpoint (and steps) until it saves its own,
    its TrialStarted records that checkpoint as restored, and the experiment lists its lineage."""
    await submit_experiment(store)
    await allocate(store, 11)
    await store.append(
        "trial-11", [CheckpointSaved(trial_id=11, run_id=1, uuid="ck-parent", steps_completed=20)]
    )
    clone = TrialRequested(
        experiment_id=1,
        trial_id=12,
        seq=2,
        request_id="r-12",
        hparams={"lr": 0.12},
        trial_seed=7,
        parent_trial_id=11,
        round=1,
        change={"lr": {"from": 0.1, "to": 0.12}},
        warm_start_checkpoint="ck-parent",
        warm_start_steps=20,
    )
    await store.append(experiment_stream(1), [clone])
    alloc = await allocate(store, 12, request=False)
    spec = await api.ok("GET", f"/api/v1/allocations/{alloc}/spec", token=api.agent)
    assert (spec["latest_checkpoint"], spec["steps_completed"]) == ("ck-parent", 20)
    await api.ok(
        "POST",
        f"/api/v1/allocations/{alloc}/started",
        token=api.agent,
        json={"agent_id": "gpu01", "idempotency_key": "s1"},
    )
    (started,) = [e for e in await store.read_stream("trial-12") if e.type == "TrialStarted"]
    assert started.payload["restored_checkpoint"] == "ck-parent"
    await store.append(
        "trial-12", [CheckpointSaved(trial_id=12, run_id=1, uuid="ck-own", steps_completed=30)]
    )
    spec = await api.ok("GET", f"/api/v1/allocations/{alloc}/spec", token=api.agent)
    assert (spec["latest_checkpoint"], spec["steps_completed"]) == ("ck-own", 30)
    detail = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    assert detail["lineage"] == [
        {
            "trial_id": 12,
            "parent_trial_id": 11,
            "round": 1,
            "change": {"lr": {"from": 0.1, "to": 0.12}},
            "warm_start_checkpoint": "ck-parent",
            "warm_start_steps": 20,
        }
    ]
