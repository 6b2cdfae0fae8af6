"""Changing experiments, users and templates through the API: who may, what hostile input gets,
and which facts land in the log (real gateway, real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.domain.config import parse_config
from events.domain.types import CheckpointSaved, ExperimentSubmitted
from events.log.store import EventStore
from services.tracker.service import catch_up
from tests.integration.test_api_queries import end_trial, set_state, submit, user, write_checkpoint
from tests.integration.test_api_support import TEST_STORAGE, Api, allocate, running_api, types_of


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def error_path(api: Api, method: str, path: str, token: str, body: Any) -> tuple[int, str]:
    """The status and the error's ``path`` of a request expected to fail."""
    status, answer = await api.call(method, path, token=token, json=body)
    assert status >= 400, (status, answer)
    return status, str(answer["error"].get("path"))


async def test_patch_changes_settings_as_facts_shown_by_describe_and_projection(
    api: Api, store: EventStore
) -> None:
    """PATCH records one fact per changed field (none when nothing changes); describe, config
    and the tracker's projection show the new name, description, labels and resources."""
    await submit(store, 1)
    path = "/api/v1/experiments/1"
    body = await api.ok(
        "PATCH",
        path,
        token=api.admin,
        json={
            "name": "renamed",
            "description": "second try",
            "add_labels": ["a", "b"],
            "resources": {"priority": 10, "weight": 2.5, "max_slots": 4},
        },
    )
    assert body["changed"] == [
        "ExperimentRenamed",
        "ExperimentDescribed",
        "ExperimentLabelsChanged",
        "ExperimentResourcesChanged",
    ]
    again = await api.ok("PATCH", path, token=api.admin, json={"name": "renamed"})
    assert again["changed"] == []
    removed = await api.ok(
        "PATCH",
        path,
        token=api.admin,
        json={"remove_labels": ["a"], "resources": {"max_slots": None}},
    )
    assert removed["labels"] == ["b"] and removed["max_slots"] is None
    assert (await types_of(store, "experiment-1")).count("ExperimentLabelsChanged") == 2

    shown = await api.ok("GET", path, token=api.admin)
    assert (shown["name"], shown["description"], shown["labels"]) == (
        "renamed",
        "second try",
        ["b"],
    )
    assert (shown["priority"], shown["weight"], shown["max_slots"]) == (10, 2.5, None)
    assert shown["config"]["resources"]["priority"] == 10
    await catch_up(store)
    row = await store.fetchrow(
        "SELECT name, description, labels, config FROM tr_experiments WHERE experiment_id = 1"
    )
    assert (row["name"], row["description"], row["labels"]) == ("renamed", "second try", ["b"])
    assert row["config"]["resources"]["weight"] == 2.5
    assert row["config"]["resources"]["max_slots"] is None
    listed = await api.ok("GET", "/api/v1/experiments", token=api.admin)
    assert listed["experiments"][0]["name"] == "renamed"


async def test_patch_is_for_the_owner_or_an_admin(api: Api, store: EventStore) -> None:
    """Another user's PATCH is 403 and records nothing; the owner's and an admin's succeed; an
    unknown experiment is 404 and one being deleted 409."""
    await submit(store, 1, owner="bob")
    bob = await user(api, store, "bob")
    carol = await user(api, store, "carol")
    status, _ = await api.call("PATCH", "/api/v1/experiments/1", token=carol, json={"name": "x"})
    assert status == 403
    assert "ExperimentRenamed" not in await types_of(store, "experiment-1")
    await api.ok("PATCH", "/api/v1/experiments/1", token=bob, json={"name": "mine"})
    await api.ok(
        "PATCH", "/api/v1/experiments/1", token=api.admin, json={"resources": {"priority": 3}}
    )
    status, _ = await api.call("PATCH", "/api/v1/experiments/99", token=bob, json={"name": "x"})
    assert status == 404
    await set_state(store, 1, "STOPPING_CANCELED", "CANCELED", "DELETING")
    status, _ = await api.call("PATCH", "/api/v1/experiments/1", token=bob, json={"name": "y"})
    assert status == 409


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "n" * 513}, "name"),
        ({"name": "   "}, "name"),
        ({"description": "d" * 10_001}, "description"),
        ({"description": "bell\x07"}, "description"),
        ({"add_labels": ["x" * 256]}, "add_labels"),
        ({"labels": [f"l{i}" for i in range(101)]}, "labels"),
        ({"add_labels": ["tab\tlabel"]}, "add_labels"),
        ({"add_labels": ["a"], "remove_labels": ["a"]}, "add_labels"),
        ({"resources": {"priority": 0}}, "resources.priority"),
        ({"resources": {"priority": None}}, "resources.priority"),
        ({"resources": {"weight": -1}}, "resources.weight"),
        ({"resources": {"max_slots": -2}}, "resources.max_slots"),
        ({"resources": {"slots_per_trial": 2}}, "resources.slots_per_trial"),
        ({"owner": "mallory"}, "owner"),
    ],
)
async def test_patch_refuses_bad_values_naming_the_field(
    api: Api, store: EventStore, body: dict[str, Any], field: str
) -> None:
    """Oversized, blank, control-character and out-of-range values are 400 naming the field,
    and nothing is recorded."""
    await submit(store, 1)
    status, path = await error_path(api, "PATCH", "/api/v1/experiments/1", api.admin, body)
    assert (status, path) == (400, field)
    assert await types_of(store, "experiment-1") == ["ExperimentSubmitted"]


async def test_max_slots_below_slots_per_trial_is_400(api: Api, store: EventStore) -> None:
    """max_slots may not drop below the experiment's slots_per_trial (1 here): 0 is refused."""
    await submit(store, 1)
    body = {"resources": {"max_slots": 0}}
    assert await error_path(api, "PATCH", "/api/v1/experiments/1", api.admin, body) == (
        400,
        "resources.max_slots",
    )


async def test_continue_reopens_an_ended_single_trial_experiment(
    api: Api, store: EventStore
) -> None:
    """Continue is 409 while the experiment runs; once it ended it appends ExperimentContinued
    and the trial's ACTIVE state change, with new constant hparams; a repeat is 409 again."""
    await submit(store, 1)
    await allocate(store, 11)
    path = "/api/v1/experiments/1/continue"
    status, _ = await api.call("POST", path, token=api.admin, json={})
    assert status == 409
    await store.append(
        "trial-11", [CheckpointSaved(trial_id=11, run_id=1, uuid="ck-1", steps_completed=10)]
    )
    await end_trial(store, 11)
    await set_state(store, 1, "STOPPING_COMPLETED", "COMPLETED")
    bad = {"config": {"searcher": {"metric": "accuracy"}}}
    assert await error_path(api, "POST", path, api.admin, bad) == (400, "config.searcher.metric")
    carol = await user(api, store, "carol")
    status, _ = await api.call("POST", path, token=carol, json={})
    assert status == 403

    body = await api.ok(
        "POST", path, token=api.admin, json={"config": {"hyperparameters": {"lr": 0.01}}}
    )
    assert body == {
        "id": 1,
        "state": "ACTIVE",
        "trial_id": 11,
        "latest_checkpoint": "ck-1",
        "trial_ids": [11],
        "latest_checkpoints": {"11": "ck-1"},
    }
    [continued] = [
        e for e in await store.read_stream("experiment-1") if e.type == "ExperimentContinued"
    ]
    assert continued.payload["trials"] == [{"trial_id": 11, "hparams": {"lr": 0.01}}]
    trial_events = await store.read_stream("trial-11")
    assert trial_events[-1].type == "TrialStateChanged"
    assert trial_events[-1].payload["state"] == "ACTIVE"
    shown = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    assert shown["state"] == "ACTIVE" and shown["ended_at"] is None
    status, _ = await api.call("POST", path, token=api.admin, json={})
    assert status == 409


async def submit_search(store: EventStore, experiment_id: int, searcher: str) -> None:
    """Appends ExperimentSubmitted of a three-point grid (or an ASHA search over the same)."""
    trials = "" if searcher == "grid" else ", max_trials: 3"
    text = f"""
name: search
entrypoint: python train.py
hyperparameters:
  lr: {{type: categorical, vals: [0.1, 0.01, 0.001]}}
searcher: {{name: {searcher}, metric: loss, max_length: {{batches: 8}}{trials}}}
checkpoint_storage: {{type: shared_fs, host_path: /tmp/ckpts}}
"""
    config = parse_config(text, default_seed=7).model_dump(mode="json")
    await store.append(
        f"experiment-{experiment_id}",
        [ExperimentSubmitted(experiment_id=experiment_id, config=config, owner="admin")],
    )


async def test_continue_reopens_the_unfinished_trials_of_an_ended_search(
    api: Api, store: EventStore
) -> None:
    """Continuing an ended grid search reopens only its trials that did not complete (each from
    its own latest checkpoint), lets only max_restarts change (400 naming the path otherwise),
    and is 409 once every trial completed; an ASHA search is 409 naming why."""
    await submit_search(store, 1, "grid")
    for trial_id in (11, 12, 13):
        await allocate(store, trial_id)
    await store.append(
        "trial-12", [CheckpointSaved(trial_id=12, run_id=1, uuid="ck-12", steps_completed=4)]
    )
    await end_trial(store, 11)
    await end_trial(store, 12, "CANCELED")
    await end_trial(store, 13, "ERROR")
    await set_state(store, 1, "STOPPING_COMPLETED", "COMPLETED")
    path = "/api/v1/experiments/1/continue"
    bad = {"config": {"hyperparameters": {"lr": 0.5}}}
    status, body = await api.call("POST", path, token=api.admin, json=bad)
    assert status == 400 and body["error"]["path"].startswith("config.hyperparameters.lr")
    assert "continuing a search (only max_restarts can)" in body["error"]["message"]

    body = await api.ok("POST", path, token=api.admin, json={"config": {"max_restarts": 2}})
    assert body["trial_ids"] == [12, 13]
    assert body["latest_checkpoints"] == {"12": "ck-12", "13": None}
    [continued] = [
        e for e in await store.read_stream("experiment-1") if e.type == "ExperimentContinued"
    ]
    assert [t["trial_id"] for t in continued.payload["trials"]] == [12, 13]
    assert continued.payload["config"]["max_restarts"] == 2
    for trial_id, reopened in ((11, False), (12, True), (13, True)):
        last = (await store.read_stream(f"trial-{trial_id}"))[-1]
        assert (last.payload["state"] == "ACTIVE") is reopened, trial_id

    await end_trial(store, 12)
    await end_trial(store, 13)
    await set_state(store, 1, "STOPPING_COMPLETED", "COMPLETED")
    status, body = await api.call("POST", path, token=api.admin, json={})
    assert status == 409 and "nothing to continue" in body["error"]["message"]

    await submit_search(store, 2, "adaptive_asha")
    await allocate(store, 21)
    await end_trial(store, 21, "CANCELED")
    await set_state(store, 2, "STOPPING_CANCELED", "CANCELED")
    status, body = await api.call(
        "POST", "/api/v1/experiments/2/continue", token=api.admin, json={}
    )
    assert status == 409 and "'adaptive_asha' search" in body["error"]["message"]


async def test_continue_refuses_a_deleted_latest_checkpoint(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """An experiment whose latest checkpoint the user deleted cannot be continued (409 naming
    the checkpoint)."""
    await submit(store, 2)
    await allocate(store, 21)
    await store.append(
        "trial-21", [CheckpointSaved(trial_id=21, run_id=1, uuid="ck-2", steps_completed=5)]
    )
    await end_trial(store, 21)
    await set_state(store, 2, "STOPPING_COMPLETED", "COMPLETED")
    await catch_up(store, checkpoint_root=tmp_path / "checkpoints")
    await api.ok(
        "DELETE", "/api/v1/checkpoints", token=api.admin, json={"checkpoint_uuids": ["ck-2"]}
    )
    status, body = await api.call(
        "POST", "/api/v1/experiments/2/continue", token=api.admin, json={}
    )
    assert status == 409 and "ck-2" in body["error"]["message"]


async def test_checkpoint_delete_rules_and_the_gc_records_it(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """Deleting checkpoints is 409 while the experiment runs, 403 for another user's, 404 for an
    unknown uuid; once ended, the GC removes the files of the ones still there and records
    CheckpointsDeleted(user)."""
    storage = tmp_path / "ckpts"
    await submit(store, 1, host_path=storage)
    await allocate(store, 11)
    for uuid, steps in (("ck-a", 5), ("ck-b", 10)):
        write_checkpoint(storage / uuid, {"state.json": b"{}"})
        await store.append(
            "trial-11",
            [CheckpointSaved(trial_id=11, run_id=1, uuid=uuid, steps_completed=steps)],
        )
    await catch_up(store)
    body = {"checkpoint_uuids": ["ck-a"]}
    status, _ = await api.call("DELETE", "/api/v1/checkpoints", token=api.admin, json=body)
    assert status == 409
    carol = await user(api, store, "carol")
    status, _ = await api.call("DELETE", "/api/v1/checkpoints", token=carol, json=body)
    assert status == 403
    status, _ = await api.call(
        "DELETE", "/api/v1/checkpoints", token=api.admin, json={"checkpoint_uuids": ["nope"]}
    )
    assert status == 404
    assert await error_path(
        api, "DELETE", "/api/v1/checkpoints", api.admin, {"checkpoint_uuids": []}
    ) == (400, "checkpoint_uuids")

    await end_trial(store, 11)
    await set_state(store, 1, "STOPPING_COMPLETED", "COMPLETED")
    # the GC policy removes ck-a and keeps the trial's latest, ck-b
    await catch_up(store, storage_policy=TEST_STORAGE)
    both = {"checkpoint_uuids": ["ck-a", "ck-b"]}
    answer = await api.ok("DELETE", "/api/v1/checkpoints", token=api.admin, json=both)
    assert answer == {"deleting": ["ck-b"], "already_deleted": ["ck-a"]}
    await catch_up(store, storage_policy=TEST_STORAGE)
    assert not (storage / "ck-b").exists()
    deleted = [e for e in await store.read_stream("experiment-1") if e.type == "CheckpointsDeleted"]
    assert [(e.payload["uuids"], e.payload["reason"]) for e in deleted] == [
        (["ck-a"], "gc"),
        (["ck-b"], "user"),
    ]
    shown = await api.ok("GET", "/api/v1/checkpoints/ck-b", token=api.admin)
    assert shown["state"] == "DELETED"


async def test_deactivated_user_cannot_log_in_or_use_tokens(api: Api, store: EventStore) -> None:
    """Deactivating (admin only) revokes the user's tokens and refuses their login; activating
    lets them log in again; an admin cannot deactivate themself."""
    bob = await user(api, store, "bob")
    carol = await user(api, store, "carol")
    status, _ = await api.call("POST", "/api/v1/users/bob/deactivate", token=carol)
    assert status == 403
    body = await api.ok("POST", "/api/v1/users/bob/deactivate", token=api.admin)
    assert body == {"username": "bob", "active": False, "changed": True}
    status, _ = await api.call("GET", "/api/v1/me", token=bob)
    assert status == 401
    status, answer = await api.call(
        "POST", "/api/v1/auth/login", json={"username": "bob", "password": "pw"}
    )
    assert status == 401 and "deactivated" in answer["error"]["message"]
    users = (await api.ok("GET", "/api/v1/users", token=api.admin))["users"]
    assert {u["username"]: u["active"] for u in users}["bob"] is False
    await api.ok("POST", "/api/v1/users/bob/activate", token=api.admin)
    assert await api.login("bob", "pw")
    status, _ = await api.call("POST", "/api/v1/users/admin/deactivate", token=api.admin)
    assert status == 409
    status, _ = await api.call("POST", "/api/v1/users/nobody/activate", token=api.admin)
    assert status == 404


async def test_change_password_own_or_admin(api: Api, store: EventStore) -> None:
    """A user changes only their own password and must give the current one; the change revokes
    their other tokens but not the one used; an admin changes anyone's."""
    bob = await user(api, store, "bob")
    other_bob = await api.login("bob", "pw")
    carol = await user(api, store, "carol")
    path = "/api/v1/users/bob/password"
    status, _ = await api.call("POST", path, token=carol, json={"password": "x"})
    assert status == 403
    assert await error_path(api, "POST", path, bob, {"password": "new"}) == (400, "old_password")
    status, _ = await api.call(
        "POST", path, token=bob, json={"password": "n", "old_password": "no"}
    )
    assert status == 403
    new = "new-password"
    await api.ok("POST", path, token=bob, json={"password": new, "old_password": "pw"})
    assert (await api.call("GET", "/api/v1/me", token=bob))[0] == 200
    assert (await api.call("GET", "/api/v1/me", token=other_bob))[0] == 401
    assert await api.login("bob", new)
    await api.ok("POST", path, token=api.admin, json={"password": "by-admin"})
    assert await api.login("bob", "by-admin")
    assert await error_path(api, "POST", path, api.admin, {"password": ""}) == (400, "password")


async def test_templates_are_facts_merged_under_experiment_configs(
    api: Api, store: EventStore
) -> None:
    """A template is set (TemplateSet), listed, read and merged under a created experiment's
    config (the experiment's values win); only its creator or an admin replaces or removes it;
    an unknown config key or template is 400 naming it."""
    bob = await user(api, store, "bob")
    carol = await user(api, store, "carol")
    template = {"config": "max_restarts: 1\nresources: {priority: 7, weight: 3}\ndescription: t\n"}
    created = await api.ok("PUT", "/api/v1/templates/defaults", token=bob, json=template)
    assert created == {"name": "defaults", "owner": "bob", "created": True}
    assert await types_of(store, "template-defaults") == ["TemplateSet"]
    status, _ = await api.call("PUT", "/api/v1/templates/defaults", token=carol, json=template)
    assert status == 403
    listed = await api.ok("GET", "/api/v1/templates", token=carol)
    assert [t["name"] for t in listed["templates"]] == ["defaults"]
    shown = await api.ok("GET", "/api/v1/templates/defaults", token=carol)
    assert shown["config"]["resources"] == {"priority": 7, "weight": 3}

    config = (
        "searcher: {name: single, metric: loss}\nentrypoint: python train.py\ndescription: mine\n"
    )
    made = await api.ok(
        "POST",
        "/api/v1/experiments",
        token=bob,
        json={"config": config, "template": "defaults", "activate": False},
    )
    exp = await api.ok("GET", f"/api/v1/experiments/{made['id']}", token=bob)
    assert exp["config"]["max_restarts"] == 1 and exp["config"]["resources"]["priority"] == 7
    assert exp["description"] == "mine"

    bad = {"config": {"no_such_field": 1}}
    assert await error_path(api, "PUT", "/api/v1/templates/t2", bob, bad) == (
        400,
        "config.no_such_field",
    )
    assert await error_path(api, "PUT", "/api/v1/templates/bad.name", bob, {"config": {}}) == (
        400,
        "name",
    )
    missing = {"config": config, "template": "nope"}
    assert await error_path(api, "POST", "/api/v1/experiments", bob, missing) == (400, "template")
    status, _ = await api.call("DELETE", "/api/v1/templates/defaults", token=carol)
    assert status == 403
    await api.ok("DELETE", "/api/v1/templates/defaults", token=api.admin)
    assert (await api.ok("GET", "/api/v1/templates", token=bob))["templates"] == []
    status, _ = await api.call("GET", "/api/v1/templates/defaults", token=bob)
    assert status == 404


async def test_master_info_needs_no_login(api: Api) -> None:
    """GET /api/v1/master answers without a token: version, a stable cluster id, uptime."""
    first = await api.ok("GET", "/api/v1/master")
    second = await api.ok("GET", "/api/v1/master")
    assert first["version"] and first["cluster_id"] == second["cluster_id"]
    assert second["uptime_seconds"] >= first["uptime_seconds"] >= 0


async def test_template_over_the_event_size_limit_is_413(api: Api, store: EventStore) -> None:
    """A template whose fact would pass the store's event size limit is refused with a 413 and
    nothing is recorded."""
    huge = {"config": {"data": {"blob": "x" * (600 * 1024)}}}
    status, body = await api.call("PUT", "/api/v1/templates/big", token=api.admin, json=huge)
    assert status == 413, body
    assert await types_of(store, "template-big") == []
