"""No cross-user damage through the API: checkpoint uuids are issued to one trial (another
trial's report of it is a 400), belong to the trial that recorded them first (a claim already in
the log is a 409, and deleting the claimer never removes the owner's files), reports are
accepted only from a trial's current run, and users read only their own work."""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.domain.names import trial_stream
from events.domain.types import (
    CheckpointSaved,
    ExperimentStateChanged,
    TrialKillRequested,
    TrialRequested,
)
from events.log.store import EventStore
from services.tracker.service import catch_up
from tests.helpers import wait_until
from tests.integration.test_api_queries import end_trial, set_state, submit, write_checkpoint
from tests.integration.test_api_support import Api, allocate, running_api, types_of
from tests.integration.test_api_trials import metrics

ALICE, BOB = "alice", "bob"


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def login(api: Api, name: str) -> str:
    """Creates the non-admin user ``name`` and returns their token."""
    password = f"{name}-password"
    await api.ok(
        "POST", "/api/v1/users", token=api.admin, json={"username": name, "password": password}
    )
    return await api.login(name, password)


def checkpoint(key: str, uuid: str, steps: int = 10, run_id: int = 1) -> dict[str, Any]:
    return {
        "kind": "checkpoint",
        "idempotency_key": key,
        "uuid": uuid,
        "run_id": run_id,
        "metadata": {"steps_completed": steps},
    }


async def post_report(
    api: Api, trial_id: int, *items: dict[str, Any], run_id: int = 1
) -> tuple[int, Any]:
    return await api.call(
        "POST",
        f"/api/v1/trials/{trial_id}/reports",
        token=api.trial_token(trial_id, run_id),
        json={"items": list(items)},
    )


async def saved_uuids(store: EventStore, trial_id: int) -> list[str]:
    return [
        e.payload["uuid"]
        for e in await store.read_stream(trial_stream(trial_id))
        if e.type == "CheckpointSaved"
    ]


async def download(api: Api, uuid: str, token: str) -> dict[str, bytes]:
    status, data = await api.call("GET", f"/api/v1/checkpoints/{uuid}/download", token=token)
    assert status == 200, (status, data)
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            content = tar.extractfile(member)
            if content is not None:
                files[member.name] = content.read()
    return files


async def two_users_two_experiments(api: Api, store: EventStore) -> tuple[str, str]:
    """Alice's experiment 1 and Bob's experiment 2, both on the cluster's default root, each
    with one allocated trial; returns their tokens."""
    alice, bob = await login(api, ALICE), await login(api, BOB)
    await submit(store, 1, owner=ALICE, storage=False)
    await submit(store, 2, owner=BOB, storage=False)
    await allocate(store, 11)
    await allocate(store, 21)
    return alice, bob


async def test_reporting_another_trials_checkpoint_uuid_is_refused_and_deletion_spares_it(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """Bob's trial reporting the uuid issued to Alice's trial (before or after she reports it)
    gets 400 and appends nothing; deleting Bob's experiment leaves Alice's files, and she still
    downloads them."""
    alice, bob = await two_users_two_experiments(api, store)
    root = tmp_path / "checkpoints"
    ck_alice = api.checkpoint_uuid(11)
    before = await types_of(store, "trial-21")
    status, body = await post_report(api, 21, checkpoint("b", ck_alice))
    assert status == 400, body
    status, _ = await post_report(api, 11, checkpoint("a", ck_alice))
    assert status == 200
    write_checkpoint(root / ck_alice, {"model.pt": b"alice's weights"})

    status, body = await post_report(api, 21, checkpoint("b", ck_alice))
    assert status == 400, body
    assert body["error"]["path"] == "items[0].uuid"
    assert "not a checkpoint uuid issued to trial 21" in body["error"]["message"]
    assert await types_of(store, "trial-21") == before
    # The refused batch claimed nothing: the same key is still new once the uuid is Bob's own.
    ck_bob = api.checkpoint_uuid(21)
    assert (await post_report(api, 21, checkpoint("b", ck_bob)))[0] == 200
    assert await saved_uuids(store, 21) == [ck_bob]

    await catch_up(store, checkpoint_root=root)
    await set_state(store, 2, "STOPPING_CANCELED", "CANCELED")
    await api.ok("DELETE", "/api/v1/experiments/2", token=bob)
    await catch_up(store, checkpoint_root=root)
    assert (root / ck_alice / "model.pt").read_bytes() == b"alice's weights"
    assert await download(api, ck_alice, alice) == {"model.pt": b"alice's weights"}


async def test_a_claim_already_in_the_log_is_409_without_naming_the_owner(
    api: Api, store: EventStore
) -> None:
    """A uuid another trial recorded first (as an older gateway let it) stays that trial's:
    a report of it by the trial it was issued to is 409 and appends nothing."""
    await two_users_two_experiments(api, store)
    uuid = api.checkpoint_uuid(21)
    saved = CheckpointSaved(
        trial_id=11, run_id=1, uuid=uuid, steps_completed=5, metadata={"steps_completed": 5}
    )
    await store.append("trial-11", [saved])
    before = await types_of(store, "trial-21")
    status, body = await post_report(api, 21, checkpoint("b", uuid))
    assert status == 409, body
    assert body["error"]["path"] == "items[0].uuid"
    assert "trial 11" not in body["error"]["message"]  # the owner is not disclosed
    assert await types_of(store, "trial-21") == before


async def test_gc_of_a_claiming_experiment_ignores_uuids_it_does_not_own(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """A claim already in the log (as an older gateway accepted it) does not make the claiming
    experiment's deletion remove the owner's directory; its own checkpoints still go."""
    alice, bob = await two_users_two_experiments(api, store)
    root = tmp_path / "checkpoints"
    ck_alice, ck_bob = api.checkpoint_uuid(11), api.checkpoint_uuid(21)
    assert (await post_report(api, 11, checkpoint("a", ck_alice)))[0] == 200
    assert (await post_report(api, 21, checkpoint("b", ck_bob)))[0] == 200
    write_checkpoint(root / ck_alice, {"model.pt": b"alice's weights"})
    write_checkpoint(root / ck_bob, {"model.pt": b"bob's weights"})
    await store.append(
        "trial-21",
        [
            CheckpointSaved(
                trial_id=21,
                run_id=1,
                uuid=ck_alice,
                steps_completed=20,
                metadata={"steps_completed": 20},
            )
        ],
    )
    await set_state(store, 2, "STOPPING_CANCELED", "CANCELED")
    await catch_up(store, checkpoint_root=root)
    await api.ok("DELETE", "/api/v1/experiments/2", token=bob)
    await catch_up(store, checkpoint_root=root)

    deleted = [
        e.payload
        for e in await store.read_stream("experiment-2")
        if e.type in ("CheckpointsDeleted", "ExperimentStateChanged")
    ]
    assert deleted[-2]["uuids"] == [ck_bob] and deleted[-1]["state"] == "DELETED"
    assert not (root / ck_bob).exists()
    assert await download(api, ck_alice, alice) == {"model.pt": b"alice's weights"}


async def test_concurrent_reports_of_one_new_uuid_record_it_once(
    api: Api, store: EventStore
) -> None:
    """The trial it was issued to and another trial reporting one new uuid at once, both
    queued behind the append lock and released together: the owner gets 200, the other 400,
    and the log records the uuid once."""
    await two_users_two_experiments(api, store)
    for round_ in range(3):
        uuid = api.checkpoint_uuid(11)
        async with store.transaction() as blocker:
            await blocker.conn.execute("LOCK TABLE events IN EXCLUSIVE MODE")  # the append lock
            calls = [
                asyncio.create_task(post_report(api, trial_id, checkpoint(f"k{round_}", uuid)))
                for trial_id in (11, 21)
            ]

            async def owner_waiting() -> bool:
                waiting = await store.fetchval(
                    """SELECT count(*) FROM pg_locks
                       WHERE relation = 'events'::regclass AND NOT granted"""
                )
                return int(waiting) >= 1

            await wait_until(owner_waiting, timeout=30)
        statuses = [status for status, _ in await asyncio.gather(*calls)]
        assert statuses == [200, 400], (uuid, statuses)
        owners = await store.fetch(
            """SELECT stream_id FROM events
               WHERE type = 'CheckpointSaved' AND payload->>'uuid' = $1""",
            uuid,
        )
        assert [r["stream_id"] for r in owners] == ["trial-11"], owners


async def test_a_completed_trials_token_cannot_report(api: Api, store: EventStore) -> None:
    """A run's last validation before it exits is accepted; once the run exited and the trial
    completed, its token is refused (403, run_not_current) for metrics, checkpoints, progress,
    early exit and logs, and the experiment's best metric is unchanged (the agent may still ship
    the run's last log lines)."""
    await submit(store, 1)
    alloc = await allocate(store, 11)
    agent_report = {"agent_id": "gpu01", "idempotency_key": "s"}
    await api.ok("POST", f"/api/v1/allocations/{alloc}/started", token=api.agent, json=agent_report)
    status, _ = await post_report(api, 11, metrics("v1", "validation", 10, loss=0.5))
    assert status == 200
    await api.ok(
        "POST",
        f"/api/v1/allocations/{alloc}/exited",
        token=api.agent,
        json={"agent_id": "gpu01", "exit_code": 0},
    )
    await end_trial(store, 11, "COMPLETED")
    await catch_up(store)
    best = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    assert best["best_metric"] == 0.5
    before = await types_of(store, "trial-11")

    without_run = metrics("v3", "validation", 20, loss=0.01)
    del without_run["run_id"]
    for item in (
        metrics("v2", "validation", 20, loss=0.01),
        without_run,
        metrics("t2", "training", 20),
        checkpoint("c2", api.checkpoint_uuid(11), 20),
        {"kind": "progress", "idempotency_key": "p", "progress": 1.0},
        {"kind": "early_exit", "idempotency_key": "e", "reason": "errored"},
    ):
        status, body = await post_report(api, 11, item)
        assert status == 403 and body["error"]["reason"] == "run_not_current", (item, body)
        assert "trial 11" in body["error"]["message"]

    lines = {"idempotency_key": "l", "lines": [{"line": "late"}]}
    status, _ = await api.call(
        "POST", f"/api/v1/allocations/{alloc}/logs", token=api.trial_token(11), json=lines
    )
    assert status == 403
    await api.ok("POST", f"/api/v1/allocations/{alloc}/logs", token=api.agent, json=lines)

    await catch_up(store)
    assert await types_of(store, "trial-11") == before
    after = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    assert after["best_metric"] == 0.5
    assert await store.fetchval("SELECT count(*) FROM trial_progress") == 0


async def test_reports_must_name_the_current_run(api: Api, store: EventStore) -> None:
    """A report naming a run that never existed, or one that exited, is 409 naming the field; a
    token of a run that exited, or of a trial never allocated, is 403 (run_not_current); an
    experiment that ended and an allocation never made are 409."""
    await submit(store, 1)
    alloc = await allocate(store, 11)
    status, body = await post_report(api, 11, metrics("m7", "training", 5, run_id=7))
    assert status == 409 and body["error"]["path"] == "items[0].run_id", body
    assert "never existed" in body["error"]["message"]
    assert (await post_report(api, 11, metrics("m1", "training", 5)))[0] == 200
    status, _ = await api.call(
        "POST",
        "/api/v1/allocations/11.9/logs",
        token=api.agent,
        json={"idempotency_key": "l", "lines": [{"line": "x"}]},
    )
    assert status == 409

    await api.ok(
        "POST",
        f"/api/v1/allocations/{alloc}/exited",
        token=api.agent,
        json={"agent_id": "gpu01", "exit_code": 1},
    )
    status, body = await post_report(api, 11, metrics("m1b", "training", 6))
    assert status == 403 and body["error"]["reason"] == "run_not_current", body
    await allocate(store, 11, run_id=2, request=False)
    status, body = await post_report(api, 11, metrics("m1c", "training", 6, run_id=1), run_id=2)
    assert status == 409 and "has exited" in body["error"]["message"], body
    status, body = await post_report(api, 11, metrics("m1d", "training", 6, run_id=2))
    assert status == 403 and body["error"]["reason"] == "run_not_current", body
    assert (await post_report(api, 11, metrics("m2", "training", 6, run_id=2), run_id=2))[0] == 200

    requested = TrialRequested(
        experiment_id=1, trial_id=12, seq=2, request_id="r-12", hparams={}, trial_seed=1
    )
    await store.append("experiment-1", [requested])
    await store.append("trial-12", [TrialKillRequested(trial_id=12, actor="admin")])
    status, body = await post_report(api, 12, metrics("n", "training", 1))
    assert status == 403 and body["error"]["reason"] == "run_not_current", body

    await store.append(
        "experiment-1", [ExperimentStateChanged(experiment_id=1, state="ERROR", reason="x")]
    )
    status, body = await post_report(api, 11, metrics("m3", "training", 7, run_id=2), run_id=2)
    assert status == 409 and "experiment has ended" in body["error"]["message"], body


async def test_users_read_only_their_own_trials_checkpoints_and_events(
    api: Api, store: EventStore
) -> None:
    """Bob gets 403 on Alice's trial, its metrics, logs and checkpoints, her experiment's lists
    and its event stream, and so does Bob's trial token; Alice, an admin, the agent and Alice's
    trial token read her metrics."""
    alice, bob = await two_users_two_experiments(api, store)
    alloc = "11.1"
    ck_alice = api.checkpoint_uuid(11)
    assert (await post_report(api, 11, metrics("m", "validation", 5, loss=0.3)))[0] == 200
    assert (await post_report(api, 11, checkpoint("c", ck_alice)))[0] == 200
    await api.ok(
        "POST",
        f"/api/v1/allocations/{alloc}/logs",
        token=api.agent,
        json={"idempotency_key": "l", "lines": [{"line": "secret"}]},
    )
    await catch_up(store)

    alices = [
        "/api/v1/trials/11",
        "/api/v1/trials/11/metrics",
        "/api/v1/trials/11/metrics?group=validation",
        "/api/v1/trials/11/logs",
        f"/api/v1/checkpoints/{ck_alice}",
        f"/api/v1/checkpoints/{ck_alice}/download",
        "/api/v1/experiments/1",
        "/api/v1/experiments/1/trials",
        "/api/v1/experiments/1/checkpoints",
        "/api/v1/events/stream?experiment_id=1",
    ]
    for path in alices:
        status, body = await api.call("GET", path, token=bob)
        assert status == 403, (path, status, body)
    for path in ("/api/v1/trials/11/metrics", "/api/v1/trials/11/metrics?group=validation"):
        status, _ = await api.call("GET", path, token=api.trial_token(21))
        assert status == 403, path
    status, _ = await api.call("GET", "/api/v1/trials/17/metrics", token=alice)
    assert status == 404

    for token in (alice, api.admin, api.agent, api.trial_token(11)):
        body = await api.ok("GET", "/api/v1/trials/11/metrics", token=token)
        assert [m["metrics"] for m in body["metrics"]] == [{"loss": 0.3}]
    assert (await api.ok("GET", f"/api/v1/checkpoints/{ck_alice}", token=alice))["trial_id"] == 11
