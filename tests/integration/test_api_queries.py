"""The query and control API over real HTTP (``docs/tracking.md``): experiment lists and
details, archive/delete, trials and checkpoints, trial logs and kill, checkpoint downloads,
agents and slots, users. Facts are appended to the log; ``catch_up`` brings the projections up
to date before reading them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from events.domain.checkpoint_storage import MARKER_FILE, marker_bytes
from events.domain.config import parse_config
from events.domain.names import trial_stream
from events.domain.types import (
    CheckpointSaved,
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialStateChanged,
    ValidationReported,
)
from events.log.store import EventStore
from services.api import projections_read as pr
from services.api.auth import create_user
from services.tracker.service import catch_up
from tests.helpers import wait_until
from tests.integration.test_api_support import (
    CONFIG,
    Api,
    allocate,
    running_api,
    types_of,
)


def serve(store: EventStore, checkpoint_root: Path) -> contextlib.AbstractAsyncContextManager[Api]:
    """The gateway on a free port with ``checkpoint_root`` as its default root, logged in."""
    return running_api(store, checkpoint_root)


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with serve(store, tmp_path / "checkpoints") as client:
        yield client


async def submit(
    store: EventStore,
    experiment_id: int,
    *,
    owner: str = "admin",
    name: str = "mnist",
    storage: bool = True,
    host_path: Path | None = None,
) -> None:
    """Appends ExperimentSubmitted with a valid config named ``name`` (and, unless ``storage``
    is false, the test config's shared_fs checkpoint storage, at ``host_path`` if given)."""
    text = CONFIG.replace("name: mnist", f"name: {name}")
    if host_path is not None:
        text = text.replace("/tmp/ckpts", str(host_path))
    if not storage:
        text = "\n".join(line for line in text.splitlines() if "checkpoint_storage" not in line)
    config = parse_config(text, default_seed=7).model_dump(mode="json")
    await store.append(
        f"experiment-{experiment_id}",
        [ExperimentSubmitted(experiment_id=experiment_id, config=config, owner=owner)],
    )


async def set_state(store: EventStore, experiment_id: int, *states: str) -> None:
    """Appends the experiment's state changes, in order."""
    await store.append(
        f"experiment-{experiment_id}",
        [ExperimentStateChanged(experiment_id=experiment_id, state=s) for s in states],
    )


async def end_trial(store: EventStore, trial_id: int, state: str = "COMPLETED") -> None:
    """Appends the trial's terminal state change."""
    await store.append(trial_stream(trial_id), [TrialStateChanged(trial_id=trial_id, state=state)])


async def user(api: Api, store: EventStore, name: str = "bob") -> str:
    """Creates a non-admin user and returns their token."""
    assert await create_user(store, name, "pw", admin=False)
    return await api.login(name, "pw")


async def test_experiment_list_filters_paginates_and_hides_others(
    api: Api, store: EventStore
) -> None:
    """The list filters by state, name, owner and archived, paginates with a total, orders by
    id, and shows a user only their own experiments."""
    await submit(store, 1, name="mnist-a")
    await submit(store, 2, name="cifar")
    await submit(store, 3, name="mnist-b", owner="bob")
    await set_state(store, 2, "STOPPING_CANCELED", "CANCELED")
    bob = await user(api, store)
    await catch_up(store)

    body = await api.ok("GET", "/api/v1/experiments", token=api.admin)
    assert [e["id"] for e in body["experiments"]] == [3, 2, 1]
    assert body["pagination"] == {"offset": 0, "limit": 100, "total": 3}
    for summary in body["experiments"]:
        pr.ExperimentSummary.model_validate(summary)
    page = await api.ok("GET", "/api/v1/experiments?limit=1&offset=1&order_by=id", token=api.admin)
    assert [e["id"] for e in page["experiments"]] == [2]
    assert page["pagination"] == {"offset": 1, "limit": 1, "total": 3}
    named = await api.ok("GET", "/api/v1/experiments?name=MNIST", token=api.admin)
    assert sorted(e["id"] for e in named["experiments"]) == [1, 3]
    canceled = await api.ok("GET", "/api/v1/experiments?state=canceled,COMPLETED", token=api.admin)
    assert [e["id"] for e in canceled["experiments"]] == [2]
    owned = await api.ok("GET", "/api/v1/experiments?owner=bob", token=api.admin)
    assert [e["id"] for e in owned["experiments"]] == [3]

    mine = await api.ok("GET", "/api/v1/experiments", token=bob)
    assert [e["id"] for e in mine["experiments"]] == [3]
    assert mine["pagination"]["total"] == 1
    others = await api.ok("GET", "/api/v1/experiments?owner=admin", token=bob)
    assert others["experiments"] == []  # another user's, where no role lets bob see them

    for bad in (
        "limit=0",
        "limit=5000",
        "limit=abc",
        "offset=-1",
        "state=BOGUS",
        "archived=x",
        "order_by=name",
        "offset=99999999999999999999999",
    ):
        status, answer = await api.call("GET", f"/api/v1/experiments?{bad}", token=api.admin)
        assert status == 400 and "error" in answer, (bad, answer)


async def test_describe_adds_projection_fields_and_trials(api: Api, store: EventStore) -> None:
    """Describe keeps the live fold and adds the projection's fields and trial summaries; another
    user's experiment is 403 and an unknown one 404."""
    await submit(store, 1)
    await allocate(store, 11)
    await store.append(
        "trial-11",
        [ValidationReported(trial_id=11, run_id=1, steps_completed=10, metrics={"loss": 0.5})],
    )
    await catch_up(store)
    body = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    assert body["state"] == "ACTIVE" and body["owner"] == "admin" and body["config"]["name"]
    assert body["name"] == "mnist" and body["archived"] is False and body["num_trials"] == 1
    assert body["searcher_metric"] == "loss" and body["smaller_is_better"] is True
    assert body["best_trial_id"] == 11 and body["best_metric"] == 0.5
    assert body["submitted_at"] and body["ended_at"] is None
    [trial] = body["trials"]
    assert trial["trial_id"] == 11 and trial["hparams"] == {"lr": 0.1}
    assert trial["trial_seed"] == 42 and trial["best_metric"] == 0.5
    pr.TrialSummary.model_validate(trial)

    await allocate(store, 12)  # not projected yet: a summary from the live fold
    body = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    assert [t["trial_id"] for t in body["trials"]] == [11, 12]
    assert body["trials"][1]["state"] == "ACTIVE"

    bob = await user(api, store)
    status, _ = await api.call("GET", "/api/v1/experiments/1", token=bob)
    assert status == 403
    for missing in ("999", "99999999999999999999999", "x"):
        status, _ = await api.call("GET", f"/api/v1/experiments/{missing}", token=api.admin)
        assert status == 404


async def test_archive_and_delete_need_a_terminal_experiment(api: Api, store: EventStore) -> None:
    """Archive, unarchive and delete are 409 on an active experiment; on a terminal one they
    append ExperimentArchived and ExperimentStateChanged(DELETING), repeats change nothing."""
    await submit(store, 1)
    base = "/api/v1/experiments/1"
    for method, path in (("POST", "/archive"), ("POST", "/unarchive"), ("DELETE", "")):
        status, body = await api.call(method, base + path, token=api.admin)
        assert status == 409 and "error" in body, (path, body)
    bob = await user(api, store)
    status, _ = await api.call("POST", f"{base}/archive", token=bob)
    assert status == 403

    await set_state(store, 1, "STOPPING_COMPLETED", "COMPLETED")
    assert await api.ok("POST", f"{base}/archive", token=api.admin) == {
        "id": 1,
        "archived": True,
        "changed": True,
    }
    assert (await api.ok("POST", f"{base}/archive", token=api.admin))["changed"] is False
    await catch_up(store)
    listed = await api.ok("GET", "/api/v1/experiments", token=api.admin)
    assert listed["experiments"] == []
    listed = await api.ok("GET", "/api/v1/experiments?archived=true", token=api.admin)
    assert [e["id"] for e in listed["experiments"]] == [1] and listed["experiments"][0]["archived"]
    assert (await api.ok("GET", base, token=api.admin))["archived"] is True
    assert (await api.ok("POST", f"{base}/unarchive", token=api.admin))["archived"] is False

    status, body = await api.call("DELETE", base, token=bob)
    assert status == 403
    status, body = await api.call("DELETE", base, token=api.admin)
    assert status == 200 and body["state"] == "DELETING" and body["changed"] is True
    assert (await api.ok("GET", base, token=api.admin))["state"] == "DELETING"
    assert await types_of(store, "experiment-1") == [
        "ExperimentSubmitted",
        "ExperimentStateChanged",
        "ExperimentStateChanged",
        "ExperimentArchived",
        "ExperimentArchived",
        "ExperimentStateChanged",
    ]
    status, _ = await api.call("DELETE", "/api/v1/experiments/404", token=api.admin)
    assert status == 404


async def test_trials_and_checkpoints_lists_and_trial_describe(api: Api, store: EventStore) -> None:
    """After catch_up an experiment lists its trials (by id or best metric) and checkpoints (by
    metric or steps, by state), and a trial describes its allocations and checkpoints."""
    await submit(store, 1)
    for trial_id, losses in ((11, (0.9, 0.7)), (12, (0.4,))):
        await allocate(store, trial_id)
        for n, loss in enumerate(losses, start=1):
            steps = 10 * n
            await store.append(
                trial_stream(trial_id),
                [
                    ValidationReported(
                        trial_id=trial_id, run_id=1, steps_completed=steps, metrics={"loss": loss}
                    ),
                    CheckpointSaved(
                        trial_id=trial_id,
                        run_id=1,
                        uuid=f"ck-{trial_id}-{steps}",
                        steps_completed=steps,
                        resources={"model.pt": 3},
                        metadata={"steps_completed": steps},
                    ),
                ],
            )
    await end_trial(store, 12)
    await catch_up(store)

    trials = await api.ok("GET", "/api/v1/experiments/1/trials", token=api.admin)
    assert [t["trial_id"] for t in trials["trials"]] == [11, 12]
    assert trials["pagination"]["total"] == 2
    best = await api.ok("GET", "/api/v1/experiments/1/trials?order_by=best", token=api.admin)
    assert [t["trial_id"] for t in best["trials"]] == [12, 11]
    done = await api.ok("GET", "/api/v1/experiments/1/trials?state=COMPLETED", token=api.admin)
    assert [t["trial_id"] for t in done["trials"]] == [12]
    paged = await api.ok("GET", "/api/v1/experiments/1/trials?limit=1&offset=1", token=api.admin)
    assert [t["trial_id"] for t in paged["trials"]] == [12]

    ckpts = await api.ok("GET", "/api/v1/experiments/1/checkpoints", token=api.admin)
    assert [c["uuid"] for c in ckpts["checkpoints"]] == ["ck-12-10", "ck-11-20", "ck-11-10"]
    assert ckpts["checkpoints"][0]["searcher_metric"] == 0.4
    for checkpoint in ckpts["checkpoints"]:
        pr.Checkpoint.model_validate(checkpoint)
    by_steps = await api.ok(
        "GET", "/api/v1/experiments/1/checkpoints?sort_by=steps&limit=1", token=api.admin
    )
    assert [c["uuid"] for c in by_steps["checkpoints"]] == ["ck-11-20"]
    assert by_steps["pagination"] == {"offset": 0, "limit": 1, "total": 3}
    deleted = await api.ok(
        "GET", "/api/v1/experiments/1/checkpoints?state=DELETED", token=api.admin
    )
    assert deleted["checkpoints"] == []

    trial = await api.ok("GET", "/api/v1/trials/11", token=api.admin)
    assert trial["trial_id"] == 11 and trial["latest_checkpoint"] == "ck-11-20"
    assert [a["allocation_id"] for a in trial["allocations"]] == ["11.1"]
    assert sorted(c["uuid"] for c in trial["checkpoints"]) == ["ck-11-10", "ck-11-20"]
    assert trial["progress"] is None
    one = await api.ok("GET", "/api/v1/checkpoints/ck-11-20", token=api.admin)
    assert one["validation"] is not None and one["searcher_metric"] == 0.7

    bob = await user(api, store)
    for path in (
        "/api/v1/trials/11",
        "/api/v1/experiments/1/trials",
        "/api/v1/experiments/1/checkpoints",
        "/api/v1/checkpoints/ck-11-20",
    ):
        status, _ = await api.call("GET", path, token=bob)
        assert status == 403, path
    for path in ("/api/v1/trials/19", "/api/v1/trials/nope", "/api/v1/checkpoints/nope"):
        status, _ = await api.call("GET", path, token=api.admin)
        assert status == 404, path
    for bad in ("order_by=worst", "state=NOPE", "limit=1001"):
        status, _ = await api.call("GET", f"/api/v1/experiments/1/trials?{bad}", token=api.admin)
        assert status == 400, bad
    status, _ = await api.call("GET", "/api/v1/experiments/1/checkpoints?state=x", token=api.admin)
    assert status == 400


async def test_trial_kill_appends_request_and_refuses_ended_trials(
    api: Api, store: EventStore
) -> None:
    """Kill appends TrialKillRequested on the trial's stream once; an ended trial is 409 and
    another user's trial 403."""
    await submit(store, 1)
    await allocate(store, 11)
    await allocate(store, 12)
    body = await api.ok("POST", "/api/v1/trials/11/kill", token=api.admin)
    assert body == {"trial_id": 11, "state": "ACTIVE", "changed": True}
    assert (await api.ok("POST", "/api/v1/trials/11/kill", token=api.admin))["changed"] is False
    [killed] = [e for e in await store.read_stream("trial-11") if e.type == "TrialKillRequested"]
    assert killed.payload == {"trial_id": 11, "actor": "admin"}

    await end_trial(store, 12, "CANCELED")
    status, answer = await api.call("POST", "/api/v1/trials/12/kill", token=api.admin)
    assert status == 409 and "error" in answer
    bob = await user(api, store)
    status, _ = await api.call("POST", "/api/v1/trials/11/kill", token=bob)
    assert status == 403
    status, _ = await api.call("POST", "/api/v1/trials/17/kill", token=api.admin)
    assert status == 404


async def post_logs(api: Api, allocation_id: str, key: str, *lines: str) -> None:
    """Ships log lines as an agent does."""
    await api.ok(
        "POST",
        f"/api/v1/allocations/{allocation_id}/logs",
        token=api.agent,
        json={"idempotency_key": key, "lines": [{"line": line} for line in lines]},
    )


async def test_logs_page_and_follow_until_the_trial_ends(api: Api, store: EventStore) -> None:
    """Logs page by after_id/limit/tail with done=false while the trial runs; follow streams
    NDJSON, picks up new lines and ends once the trial is terminal and the lines are drained."""
    await submit(store, 1)
    allocation_id = await allocate(store, 11)
    await post_logs(api, allocation_id, "b1", "one", "two", "three")
    page = await api.ok("GET", "/api/v1/trials/11/logs?limit=2", token=api.admin)
    assert [entry["line"] for entry in page["logs"]] == ["one", "two"]
    assert page["done"] is False and page["logs"][0]["allocation_id"] == allocation_id
    rest = await api.ok(
        "GET", f"/api/v1/trials/11/logs?after_id={page['next_after_id']}", token=api.admin
    )
    assert [entry["line"] for entry in rest["logs"]] == ["three"]
    tail = await api.ok("GET", "/api/v1/trials/11/logs?tail=2", token=api.admin)
    assert [entry["line"] for entry in tail["logs"]] == ["two", "three"]
    for bad in ("limit=0", "limit=100000", "after_id=-1", "tail=x", "follow=maybe"):
        status, _ = await api.call("GET", f"/api/v1/trials/11/logs?{bad}", token=api.admin)
        assert status == 400, bad

    received: list[dict[str, Any]] = []

    async def follow() -> None:
        async with api.session.get(
            f"{api.url}/api/v1/trials/11/logs?follow=true&after_id={page['next_after_id']}",
            headers={"Authorization": f"Bearer {api.admin}"},
        ) as resp:
            assert resp.status == 200
            assert resp.content_type == "application/x-ndjson"
            async for raw in resp.content:
                received.append(json.loads(raw))

    follower = asyncio.create_task(follow())
    await wait_until(lambda: len(received) == 1)  # following: "three" came before any new line
    await post_logs(api, allocation_id, "b2", "four")
    await wait_until(lambda: len(received) == 2)
    assert not follower.done(), "a follow stays open while the trial runs"
    await post_logs(api, allocation_id, "b3", "five")
    await end_trial(store, 11)
    await asyncio.wait_for(follower, timeout=10)
    assert [entry["line"] for entry in received] == ["three", "four", "five"]

    final = await api.ok("GET", "/api/v1/trials/11/logs", token=api.admin)
    assert final["done"] is True and len(final["logs"]) == 5
    bob = await user(api, store)
    status, _ = await api.call("GET", "/api/v1/trials/11/logs", token=bob)
    assert status == 403


def write_checkpoint(directory: Path, files: dict[str, bytes]) -> None:
    """Creates checkpoint ``directory`` as the Core API leaves it: ``files`` (relative path ->
    content) plus cairn's marker naming the directory's uuid."""
    for relative, data in {**files, MARKER_FILE: marker_bytes(directory.name)}.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


async def test_checkpoint_download_streams_a_tarball(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """A checkpoint downloads as a tar.gz of its directory under the default root (no
    checkpoint_storage) or the experiment's own; missing files are 404, others' 403."""
    await submit(store, 1, storage=False)
    await submit(store, 2, host_path=tmp_path / "shared")
    for trial_id, uuid in ((11, "ck-a"), (21, "ck-b"), (11, "ck-gone")):
        if not await store.stream_version(trial_stream(trial_id)):
            await allocate(store, trial_id)
        await store.append(
            trial_stream(trial_id),
            [
                CheckpointSaved(
                    trial_id=trial_id,
                    run_id=1,
                    uuid=uuid,
                    steps_completed=5,
                    metadata={"steps_completed": 5},
                )
            ],
        )
    write_checkpoint(
        tmp_path / "checkpoints" / "ck-a",
        {"model.pt": b"weights" * 1000, "sub/state.json": b'{"step": 5}'},
    )
    write_checkpoint(tmp_path / "shared" / "ck-b", {"x.bin": b"x"})
    await catch_up(store)

    status, data = await api.call("GET", "/api/v1/checkpoints/ck-a/download", token=api.admin)
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = sorted(tar.getnames())
        assert names == ["model.pt", "sub/state.json"]
        member = tar.extractfile("model.pt")
        assert member is not None and member.read() == b"weights" * 1000
    status, data = await api.call("GET", "/api/v1/checkpoints/ck-b/download", token=api.admin)
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.getnames() == ["x.bin"]

    status, body = await api.call("GET", "/api/v1/checkpoints/ck-gone/download", token=api.admin)
    assert status == 404 and "error" in body
    status, _ = await api.call("GET", "/api/v1/checkpoints/nope/download", token=api.admin)
    assert status == 404
    bob = await user(api, store)
    status, _ = await api.call("GET", "/api/v1/checkpoints/ck-a/download", token=bob)
    assert status == 403


async def test_agent_and_slot_disable_enable(api: Api, store: EventStore) -> None:
    """Admins disable and enable agents and slots (SlotsDisabled/SlotsEnabled on agent-<id>), the
    projection shows it after catch_up; unknown agents or slots are 404, users 403."""
    await api.ok(
        "POST",
        "/api/v1/agents/gpu01/register",
        token=api.agent,
        json={"slots": [{"slot_id": "0"}, {"slot_id": "1"}], "hostname": "h1"},
    )
    slot = await api.ok("POST", "/api/v1/agents/gpu01/slots/1/disable", token=api.admin)
    assert slot == {"agent_id": "gpu01", "slot_id": "1", "enabled": False}
    await catch_up(store)
    slots = await api.ok("GET", "/api/v1/slots", token=api.admin)
    assert [(s["slot_id"], s["enabled"]) for s in slots["slots"]] == [("0", True), ("1", False)]

    agent = await api.ok(
        "POST", "/api/v1/agents/gpu01/disable", token=api.admin, json={"drain": True}
    )
    assert agent == {"agent_id": "gpu01", "enabled": False}
    await catch_up(store)
    [listed] = (await api.ok("GET", "/api/v1/agents", token=api.admin))["agents"]
    pr.Agent.model_validate(listed)
    assert listed["enabled"] is False and listed["hostname"] == "h1"
    assert listed["last_heartbeat"] is not None
    assert [(s["enabled"], s["draining"]) for s in listed["slots"]] == [(False, True)] * 2

    await api.ok("POST", "/api/v1/agents/gpu01/enable", token=api.admin)
    await catch_up(store)
    one = await api.ok("GET", "/api/v1/agents/gpu01", token=api.admin)
    assert one["enabled"] is True and all(s["enabled"] for s in one["slots"])
    events = [e for e in await store.read_stream("agent-gpu01") if e.type != "AgentRegistered"]
    assert [(e.type, e.payload["slot_ids"]) for e in events] == [
        ("SlotsDisabled", ["1"]),
        ("SlotsDisabled", []),
        ("SlotsEnabled", []),
    ]
    assert events[1].payload["drain"] is True and events[1].payload["actor"] == "admin"

    for path in ("/api/v1/agents/nope/disable", "/api/v1/agents/gpu01/slots/9/enable"):
        status, _ = await api.call("POST", path, token=api.admin)
        assert status == 404, path
    status, _ = await api.call("GET", "/api/v1/agents/nope", token=api.admin)
    assert status == 404
    status, _ = await api.call(
        "POST", "/api/v1/agents/gpu01/disable", token=api.admin, json={"drain": "sometimes"}
    )
    assert status == 400
    bob = await user(api, store)
    status, _ = await api.call("POST", "/api/v1/agents/gpu01/disable", token=bob)
    assert status == 403
    assert (await api.ok("GET", "/api/v1/agents", token=bob))["agents"]


async def test_users_are_created_and_listed_by_admins_only(api: Api, store: EventStore) -> None:
    """Admins create users (409 for a taken name, 400 for a bad one) and list them; the new user
    logs in, and a non-admin gets 403 on both."""
    body = await api.ok(
        "POST",
        "/api/v1/users",
        token=api.admin,
        json={"username": "carol", "password": "carol-password", "admin": False},
    )
    assert body == {"username": "carol", "admin": False}
    status, _ = await api.call(
        "POST",
        "/api/v1/users",
        token=api.admin,
        json={"username": "carol", "password": "other-password"},
    )
    assert status == 409
    status, answer = await api.call(
        "POST", "/api/v1/users", token=api.admin, json={"username": "bad name", "password": "x"}
    )
    assert status == 400 and answer["error"]["path"] == "username"
    users = await api.ok("GET", "/api/v1/users", token=api.admin)
    assert [(u["username"], u["admin"]) for u in users["users"]] == [
        ("admin", True),
        ("carol", False),
    ]
    carol = await api.login("carol", "carol-password")
    status, _ = await api.call("GET", "/api/v1/users", token=carol)
    assert status == 403
    status, _ = await api.call(
        "POST", "/api/v1/users", token=carol, json={"username": "dave", "password": "x"}
    )
    assert status == 403


async def test_openapi_documents_the_query_api(api: Api) -> None:
    """The OpenAPI document has the query endpoints with their query parameters."""
    doc = await api.ok("GET", "/api/v1/openapi.json", token=api.admin)
    params = {p["name"] for p in doc["paths"]["/api/v1/experiments"]["get"]["parameters"]}
    assert {"state", "owner", "archived", "name", "order_by", "limit", "offset"} <= params
    assert "delete" in doc["paths"]["/api/v1/experiments/{experiment_id}"]
    assert doc["paths"]["/api/v1/users"]["post"]["x-cairn-allow"] == ["admin"]
    assert (
        "text/event-stream"
        in doc["paths"]["/api/v1/events/stream"]["get"]["responses"]["200"]["content"]
    )
