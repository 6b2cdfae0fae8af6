"""The model registry over real HTTP on a real PostgreSQL: models and numbered versions are facts
of their streams, names follow Determined's rules, another user reads but does not change, and a
registered checkpoint is kept from the GC, from a direct delete and from its experiment's
deletion until its version goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.domain.model_registry import REGISTRY_LOCK
from events.domain.names import trial_stream
from events.domain.types import CheckpointSaved, CheckpointsDeleted
from events.log.store import EventStore
from services.tracker.service import catch_up
from tests.helpers import wait_until
from tests.integration.test_api_ownership import login
from tests.integration.test_api_queries import end_trial, set_state, submit, write_checkpoint
from tests.integration.test_api_support import TEST_STORAGE, Api, allocate, running_api, types_of

ALICE, BOB = "alice", "bob"


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def save(store: EventStore, trial_id: int, uuid: str, steps: int) -> None:
    """Appends the trial's report of checkpoint ``uuid`` at ``steps``."""
    saved = CheckpointSaved(
        trial_id=trial_id, run_id=1, uuid=uuid, steps_completed=steps, metadata={"s": steps}
    )
    await store.append(trial_stream(trial_id), [saved])


async def alices_experiment(api: Api, store: EventStore, root: Path) -> tuple[str, str, str, str]:
    """Alice's experiment 1 (default root, no validations) with checkpoints c1 at 10 steps and
    c2 at 20 on disk, projected; returns Alice's and Bob's tokens and the two uuids."""
    alice, bob = await login(api, ALICE), await login(api, BOB)
    await submit(store, 1, owner=ALICE, storage=False)
    await allocate(store, 11)
    c1, c2 = api.checkpoint_uuid(11), api.checkpoint_uuid(11)
    for uuid, steps in ((c1, 10), (c2, 20)):
        await save(store, 11, uuid, steps)
        write_checkpoint(root / uuid, {"model.pt": f"weights at {steps}".encode()})
    await catch_up(store, checkpoint_root=root, storage_policy=TEST_STORAGE)
    return alice, bob, c1, c2


async def end_experiment(store: EventStore, root: Path) -> None:
    """Completes trial 11 and experiment 1, then runs the tracker (projections and GC)."""
    await end_trial(store, 11)
    await set_state(store, 1, "STOPPING_COMPLETED", "COMPLETED")
    await catch_up(store, checkpoint_root=root, storage_policy=TEST_STORAGE)


async def status_of(api: Api, method: str, path: str, token: str, body: Any = None) -> int:
    status, _ = await api.call(method, path, token=token, json=body)
    return status


async def test_models_and_versions_are_facts_with_names_numbers_and_archive_rules(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """Creating, editing, archiving and deleting a model and registering, editing and deleting
    versions append the registry's facts; names follow the rules (409 for a taken one, 400
    naming the rule otherwise); version numbers are never given twice; an archived model takes
    no edit and no version; a deleted model's name is free again under a new number."""
    root = tmp_path / "checkpoints"
    alice, _, c1, c2 = await alices_experiment(api, store, root)
    body = {"name": "mnist cnn", "description": "digits", "labels": ["a", "b", "a"]}
    model = await api.ok("POST", "/api/v1/models", token=alice, json=body)
    assert model["id"] == 1 and model["username"] == ALICE and model["labels"] == ["a", "b"]
    assert model["workspace"] == "Uncategorized" and model["num_versions"] == 0
    assert await types_of(store, "model-1") == ["ModelCreated"]

    status, answer = await api.call("POST", "/api/v1/models", token=alice, json=body)
    assert status == 409 and answer["error"]["path"] == "name", answer
    for bad, rule in (
        ("   ", "blank"),
        ("a  b", "double space"),
        ("a/b", "'/'"),
        ("a\\b", "'/'"),
        ("2024", "all digits"),
        ("x" * 256, "at most 255"),
        ("tab\there", "control"),
    ):
        status, answer = await api.call("POST", "/api/v1/models", token=alice, json={"name": bad})
        assert status == 400 and rule in answer["error"]["message"], (bad, answer)
    assert (await api.ok("POST", "/api/v1/models", token=alice, json={"name": "MNIST cnn"}))[
        "id"
    ] == 2  # names are case-sensitive
    big = {"name": "big", "metadata": {"blob": "x" * 70_000}}
    status, answer = await api.call("POST", "/api/v1/models", token=alice, json=big)
    assert status == 400 and answer["error"]["path"] == "metadata", answer
    status, answer = await api.call(
        "POST", "/api/v1/models", token=alice, json={"name": "w", "workspace_name": "research"}
    )
    assert status == 400 and answer["error"]["path"] == "workspace_name", answer

    by_number = await api.ok("GET", "/api/v1/models/1", token=alice)
    assert by_number["name"] == "mnist cnn"
    patched = await api.ok(
        "PATCH", "/api/v1/models/mnist cnn", token=alice, json={"labels": ["x", "x", "y"]}
    )
    assert patched["labels"] == ["x", "y"]
    status, _ = await api.call(
        "PATCH", "/api/v1/models/mnist cnn", token=alice, json={"name": "MNIST cnn"}
    )
    assert status == 409

    versions = "/api/v1/models/mnist cnn/versions"
    first = await api.ok("POST", versions, token=alice, json={"checkpoint_uuid": c1})
    assert first["version"] == 1 and first["checkpoint"]["uuid"] == c1
    assert first["checkpoint"]["state"] == "COMPLETED" and first["model"]["id"] == 1
    second = await api.ok(
        "POST", versions, token=alice, json={"checkpoint_uuid": c2, "name": "later"}
    )
    assert second["version"] == 2
    await api.ok("DELETE", f"{versions}/2", token=alice)
    third = await api.ok("POST", versions, token=alice, json={"checkpoint_uuid": c2})
    assert third["version"] == 3  # 2 is never given again
    listed = await api.ok("GET", versions, token=alice)
    assert [v["version"] for v in listed["model_versions"]] == [1, 3]
    assert listed["model"]["num_versions"] == 2
    assert (await api.ok("GET", f"{versions}/-1", token=alice))["version"] == 3
    status, answer = await api.call(
        "PATCH", f"{versions}/1", token=alice, json={"checkpoint_uuid": c2}
    )
    assert status == 400 and answer["error"]["path"] == "checkpoint_uuid", answer
    edited = await api.ok(
        "PATCH", f"{versions}/1", token=alice, json={"comment": "best so far", "labels": ["p"]}
    )
    assert edited["comment"] == "best so far" and edited["checkpoint"]["uuid"] == c1

    await api.ok("POST", "/api/v1/models/mnist cnn/archive", token=alice, json={})
    for method, path, payload in (
        ("PATCH", "/api/v1/models/mnist cnn", {"description": "no"}),
        ("POST", versions, {"checkpoint_uuid": c1}),
        ("PATCH", f"{versions}/1", {"comment": "no"}),
    ):
        status, answer = await api.call(method, path, token=alice, json=payload)
        assert status == 409 and "archived" in answer["error"]["message"], (path, answer)
    await api.ok("POST", "/api/v1/models/mnist cnn/unarchive", token=alice, json={})

    names = await api.ok("GET", "/api/v1/models?sort_by=name&order_by=desc", token=alice)
    assert [m["name"] for m in names["models"]] == ["mnist cnn", "MNIST cnn"]
    await api.ok("DELETE", "/api/v1/models/mnist cnn", token=alice)
    assert await status_of(api, "GET", "/api/v1/models/mnist cnn", alice) == 404
    assert await status_of(api, "GET", "/api/v1/models/1", alice) == 404
    again = await api.ok("POST", "/api/v1/models", token=alice, json={"name": "mnist cnn"})
    assert again["id"] == 3 and again["num_versions"] == 0
    assert await types_of(store, "model-1") == [
        "ModelCreated",
        "ModelEdited",
        "ModelVersionRegistered",
        "ModelVersionRegistered",
        "ModelVersionDeleted",
        "ModelVersionRegistered",
        "ModelVersionEdited",
        "ModelArchived",
        "ModelArchived",
        "ModelDeleted",
    ]

    await catch_up(store, checkpoint_root=root, storage_policy=TEST_STORAGE)
    audited = await store.fetch(
        "SELECT type, actor FROM audit_trail WHERE stream_id = 'model-1' ORDER BY position"
    )
    assert [r["type"] for r in audited][:2] == ["ModelCreated", "ModelEdited"]
    assert {r["actor"] for r in audited} == {ALICE}


async def test_another_user_reads_models_but_changes_none_and_registers_only_readable_checkpoints(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """Bob reads Alice's model and its versions but every change is 403; he may not register
    Alice's checkpoint in his own model (403); an unknown checkpoint is 404, a deleted one 409;
    malformed bodies are 400 and append nothing; an admin may change Alice's model."""
    root = tmp_path / "checkpoints"
    alice, bob, c1, _ = await alices_experiment(api, store, root)
    await api.ok("POST", "/api/v1/models", token=alice, json={"name": "alices"})
    await api.ok(
        "POST", "/api/v1/models/alices/versions", token=alice, json={"checkpoint_uuid": c1}
    )
    assert (await api.ok("GET", "/api/v1/models/alices", token=bob))["username"] == ALICE
    assert (
        len((await api.ok("GET", "/api/v1/models/alices/versions", token=bob))["model_versions"])
        == 1
    )
    for method, path, payload in (
        ("PATCH", "/api/v1/models/alices", {"description": "mine now"}),
        ("POST", "/api/v1/models/alices/archive", {}),
        ("DELETE", "/api/v1/models/alices", None),
        ("POST", "/api/v1/models/alices/versions", {"checkpoint_uuid": c1}),
        ("PATCH", "/api/v1/models/alices/versions/1", {"comment": "x"}),
        ("DELETE", "/api/v1/models/alices/versions/1", None),
    ):
        assert await status_of(api, method, path, bob, payload) == 403, (method, path)
    before = await types_of(store, "model-1")

    await api.ok("POST", "/api/v1/models", token=bob, json={"name": "bobs"})
    bobs = "/api/v1/models/bobs/versions"
    assert await status_of(api, "POST", bobs, bob, {"checkpoint_uuid": c1}) == 403
    status, answer = await api.call("POST", bobs, token=bob, json={"checkpoint_uuid": "nope"})
    assert status == 404 and "no checkpoint" in answer["error"]["message"]
    for hostile in (
        {"checkpoint_uuid": ""},
        {"checkpoint_uuid": c1, "colour": "red"},
        {"checkpoint_uuid": c1, "metadata": [1, 2]},
        {"checkpoint_uuid": "a" * 200},
    ):
        assert await status_of(api, "POST", bobs, bob, hostile) == 400, hostile
    status, _ = await api.call("POST", "/api/v1/models", token=bob, data=b"{not json")
    assert status == 400
    assert await types_of(store, "model-2") == ["ModelCreated"]
    assert await types_of(store, "model-1") == before

    await end_experiment(store, root)
    gone = api.checkpoint_uuid(11)
    await save(store, 11, gone, 30)
    await store.append(
        "experiment-1", [CheckpointsDeleted(experiment_id=1, uuids=[gone], reason="user")]
    )
    await catch_up(store, checkpoint_root=root, storage_policy=TEST_STORAGE)
    status, answer = await api.call(
        "POST", "/api/v1/models/alices/versions", token=alice, json={"checkpoint_uuid": gone}
    )
    assert status == 409 and answer["error"]["path"] == "checkpoint_uuid", answer
    assert "DELETED" in answer["error"]["message"]

    await api.ok("PATCH", "/api/v1/models/alices", token=api.admin, json={"notes": "reviewed"})


async def test_gc_keeps_a_registered_checkpoint_until_its_version_is_deleted(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """c1 (not the latest, never validated) is what the default policy deletes when the
    experiment completes; registered, it stays on disk and in the log; once its version is
    deleted the GC deletes it."""
    root = tmp_path / "checkpoints"
    alice, _, c1, c2 = await alices_experiment(api, store, root)
    await api.ok("POST", "/api/v1/models", token=alice, json={"name": "keeper"})
    await api.ok(
        "POST", "/api/v1/models/keeper/versions", token=alice, json={"checkpoint_uuid": c1}
    )
    await end_experiment(store, root)
    assert (root / c1 / "model.pt").exists() and (root / c2 / "model.pt").exists()
    assert "CheckpointsDeleted" not in await types_of(store, "experiment-1")

    await api.ok("DELETE", "/api/v1/models/keeper/versions/1", token=alice)
    await catch_up(store, checkpoint_root=root, storage_policy=TEST_STORAGE)
    assert not (root / c1).exists() and (root / c2 / "model.pt").exists()
    deleted = [
        e.decode_as(CheckpointsDeleted).uuids
        for e in await store.read_stream("experiment-1")
        if e.type == "CheckpointsDeleted"
    ]
    assert deleted == [[c1]]
    row = await api.ok("GET", f"/api/v1/checkpoints/{c1}", token=alice)
    assert row["state"] == "DELETED"


async def test_deleting_a_registered_checkpoint_or_its_experiment_is_409_naming_the_version(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """While c2 backs version 1 of model "prod", deleting c2 or experiment 1 is 409 naming the
    model and version, and appends nothing; after the model is deleted, both are allowed and
    the experiment ends DELETED with its files gone."""
    root = tmp_path / "checkpoints"
    alice, _, _, c2 = await alices_experiment(api, store, root)
    await end_experiment(store, root)
    await api.ok("POST", "/api/v1/models", token=alice, json={"name": "prod"})
    await api.ok("POST", "/api/v1/models/prod/versions", token=alice, json={"checkpoint_uuid": c2})
    before = await types_of(store, "experiment-1")
    body = {"checkpoint_uuids": [c2]}
    for method, path, payload in (
        ("DELETE", "/api/v1/checkpoints", body),
        ("DELETE", "/api/v1/experiments/1", None),
    ):
        status, answer = await api.call(method, path, token=alice, json=payload)
        assert status == 409, (path, answer)
        assert "model 'prod' version 1" in answer["error"]["message"], answer
        assert answer["error"]["reason"] == "checkpoints_registered"
    assert await types_of(store, "experiment-1") == before

    await api.ok("DELETE", "/api/v1/models/prod", token=alice)
    await api.ok("DELETE", "/api/v1/experiments/1", token=alice)
    await catch_up(store, checkpoint_root=root, storage_policy=TEST_STORAGE)
    assert (await api.ok("GET", "/api/v1/experiments/1", token=alice))["state"] == "DELETED"
    assert not (root / c2).exists()


async def test_a_registration_waiting_on_a_gc_pass_sees_its_deletion_and_is_refused(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """A GC pass holding the registry lock deletes c1; a registration of c1 made meanwhile
    waits on the lock, then reads the deletion and is 409, so the log never holds a version of
    a deleted checkpoint."""
    root = tmp_path / "checkpoints"
    alice, _, c1, _ = await alices_experiment(api, store, root)
    await end_trial(store, 11)
    await set_state(store, 1, "STOPPING_COMPLETED", "COMPLETED")
    await api.ok("POST", "/api/v1/models", token=alice, json={"name": "racer"})
    async with store.transaction() as gc:
        await gc.conn.execute("SELECT pg_advisory_xact_lock($1)", REGISTRY_LOCK)
        call = asyncio.create_task(
            api.call(
                "POST",
                "/api/v1/models/racer/versions",
                token=alice,
                json={"checkpoint_uuid": c1},
            )
        )

        async def registration_waiting() -> bool:
            waiting = await store.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            return int(waiting) >= 1

        await wait_until(registration_waiting, timeout=30)
        await gc.append(
            "experiment-1",
            [CheckpointsDeleted(experiment_id=1, uuids=[c1], reason="gc")],
        )
    status, answer = await call
    assert status == 409 and "DELETED" in answer["error"]["message"], answer
    assert await types_of(store, "model-1") == ["ModelCreated"]
