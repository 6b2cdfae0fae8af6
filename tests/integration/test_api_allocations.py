"""Agents and allocations through the API gateway: registration, heartbeats, spec, started and
exited reports, logs, and the preemption long poll."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from events.domain.identities import ASSIGNED_UIDS, IDENTITIES_STREAM
from events.domain.types import (
    AgentLost,
    CheckpointSaved,
    KillRequested,
    PreemptionRequested,
    TrialExited,
)
from events.log.store import EventStore
from tests.integration.test_api_support import (
    Api,
    allocate,
    running_api,
    submit_experiment,
    types_of,
)

SLOTS = {"resource_pool": "default", "hostname": "h1", "slots": [{"slot_id": "0", "device": "cpu"}]}


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def test_register_is_idempotent_until_lost(api: Api, store: EventStore) -> None:
    """Re-registering the same slots appends nothing; after AgentLost or a slot change it appends."""
    path = "/api/v1/agents/gpu01/register"
    assert (await api.ok("POST", path, token=api.agent, json=SLOTS))["changed"] is True
    assert (await api.ok("POST", path, token=api.agent, json=SLOTS))["changed"] is False
    assert await types_of(store, "agent-gpu01") == ["AgentRegistered"]
    await store.append("agent-gpu01", [AgentLost(agent_id="gpu01")])
    hb = await api.ok("POST", "/api/v1/agents/gpu01/heartbeat", token=api.agent, json={})
    assert hb == {"registered": False}
    assert (await api.ok("POST", path, token=api.agent, json=SLOTS))["changed"] is True
    more = {**SLOTS, "slots": [*SLOTS["slots"], {"slot_id": "1", "device": "cpu"}]}
    assert (await api.ok("POST", path, token=api.agent, json=more))["changed"] is True
    assert await types_of(store, "agent-gpu01") == [
        "AgentRegistered",
        "AgentLost",
        "AgentRegistered",
        "AgentRegistered",
    ]
    status, body = await api.call(
        "POST", path, token=api.agent, json={"slots": [{"device": "tpu"}]}
    )
    assert status == 400 and body["error"]["path"].startswith("slots[0]")


async def test_heartbeat_upserts_a_row(api: Api, store: EventStore) -> None:
    """A heartbeat writes agent_heartbeats (not the log) and the latest running list wins."""
    await api.ok("POST", "/api/v1/agents/gpu01/register", token=api.agent, json=SLOTS)
    head = await store.head()
    for running in (["11.1"], ["11.1", "21.1"]):
        body = await api.ok(
            "POST", "/api/v1/agents/gpu01/heartbeat", token=api.agent, json={"running": running}
        )
        assert body == {"registered": True}
    row = await store.fetchrow("SELECT * FROM agent_heartbeats WHERE agent_id = 'gpu01'")
    assert row["running"] == ["11.1", "21.1"]
    assert await store.head() == head


async def test_spec_folds_trial_experiment_and_checkpoint(api: Api, store: EventStore) -> None:
    """The spec carries hparams, seed, config parts, latest checkpoint, the owner and cluster id
    and a working trial token; it turns inactive once a newer allocation exists."""
    await submit_experiment(store, owner="alice")
    alloc = await allocate(store, 11, slots=("0", "1"))
    await store.append(
        "trial-11",
        [CheckpointSaved(trial_id=11, run_id=1, uuid="ck-1", steps_completed=50)],
    )
    spec = await api.ok("GET", f"/api/v1/allocations/{alloc}/spec?agent_id=gpu01", token=api.agent)
    assert spec["active"] is True
    assert (spec["trial_id"], spec["experiment_id"], spec["run_id"]) == (11, 1, 1)
    assert spec["hparams"] == {"lr": 0.1} and spec["trial_seed"] == 42
    assert spec["entrypoint"] == "python train.py"
    assert spec["checkpoint_storage"]["host_path"] == "/tmp/ckpts"
    assert spec["environment_variables"] == {"FOO": "bar"}
    assert (spec["latest_checkpoint"], spec["steps_completed"]) == ("ck-1", 50)
    assert spec["slot_ids"] == ["0", "1"]
    master = await api.ok("GET", "/api/v1/master")
    assert spec["user"] == "alice" and spec["cluster_id"] == master["cluster_id"] != ""
    assert (await api.ok("GET", "/api/v1/me", token=spec["token"]))["trial_id"] == 11
    await allocate(store, 11, run_id=2, request=False)
    spec = await api.ok("GET", f"/api/v1/allocations/{alloc}/spec", token=api.agent)
    assert spec["active"] is False
    status, _ = await api.call("GET", "/api/v1/allocations/11.9/spec", token=api.agent)
    assert status == 404


async def test_spec_names_the_owners_identity_assigned_once_and_linked_by_an_admin(
    api: Api, store: EventStore
) -> None:
    """Concurrent first specs of two users' runs assign each user one uid of their own (once,
    whatever the race: every spec of a user names the same uid); an admin's link changes what
    the user's next spec names, and is a fact in the log."""
    await submit_experiment(store, 1, owner="alice")
    await submit_experiment(store, 2, owner="bob")
    a, b = await allocate(store, 11), await allocate(store, 21)
    specs = await asyncio.gather(
        *(
            api.ok("GET", f"/api/v1/allocations/{alloc}/spec", token=api.agent)
            for alloc in (a, b, a, b)
        )
    )
    groups = [s["agent_user_group"] for s in specs]
    assert groups[0] == groups[2] and groups[1] == groups[3]
    assert {g["agent_uid"] for g in groups} == set(ASSIGNED_UIDS[:2])
    assert all(g["agent_uid"] == g["agent_gid"] and not g["linked"] for g in groups)
    assert groups[0]["agent_user"] == "alice"
    assert await types_of(store, IDENTITIES_STREAM) == ["AgentUserAssigned"] * 2
    admin = await api.login()
    await api.ok("POST", "/api/v1/users", admin, {"username": "alice", "password": "pw-alice"})
    body = {"agent_uid": 1500, "agent_gid": 1600, "agent_user": "al", "agent_group": "ml"}
    await api.ok("PUT", "/api/v1/users/alice/agent-user-group", admin, body)
    spec = await api.ok("GET", f"/api/v1/allocations/{a}/spec", token=api.agent)
    assert spec["agent_user_group"] == {**body, "linked": True}
    assert (await types_of(store, IDENTITIES_STREAM))[-1] == "AgentUserLinked"


async def test_started_and_exited_are_idempotent(api: Api, store: EventStore) -> None:
    """Repeating started/exited (same or new key) appends TrialStarted, TrialExited and
    SlotsReleased once each."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    base = f"/api/v1/allocations/{alloc}"
    for key in ("s1", "s1", "s2"):
        await api.ok(
            "POST",
            f"{base}/started",
            token=api.agent,
            json={"agent_id": "gpu01", "idempotency_key": key},
        )
    await asyncio.gather(
        *(
            api.ok(
                "POST",
                f"{base}/exited",
                token=api.agent,
                json={"agent_id": "gpu01", "exit_code": 0, "idempotency_key": "e1"},
            )
            for _ in range(3)
        )
    )
    events = await store.read_stream("trial-11")
    assert [e.type for e in events] == [
        "SlotsAllocated",
        "TrialStarted",
        "TrialExited",
        "SlotsReleased",
    ]
    assert events[2].payload["outcome"] == "completed"
    assert events[3].payload["placements"] == {"gpu01": ["0"]}
    status, _ = await api.call(
        "POST", f"{base}/started", token=api.trial_token(11), json={"agent_id": "gpu01"}
    )
    assert status == 403


@pytest.mark.parametrize(
    ("signal", "exit_code", "shutdown", "outcome"),
    [
        (None, 1, None, "failed"),
        ("preempt", 0, None, "preempted"),
        ("kill", 137, None, "killed"),
        (None, 143, True, "lost"),
        (None, 0, True, "lost"),
        (None, 0, False, "completed"),
        ("preempt", 143, True, "preempted"),
        ("kill", 143, True, "killed"),
    ],
)
async def test_exit_outcome_follows_signals(
    api: Api,
    store: EventStore,
    signal: str | None,
    exit_code: int,
    shutdown: bool | None,
    outcome: str,
) -> None:
    """TrialExited's outcome is killed after KillRequested, preempted after PreemptionRequested,
    lost when the agent stopped the run during its own shutdown (whatever the exit code), else
    completed or failed by the exit code; reports without ``agent_shutdown`` still work."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    if signal == "preempt":
        await store.append(
            "trial-11", [PreemptionRequested(trial_id=11, allocation_id=alloc, reason="pause")]
        )
    elif signal == "kill":
        await store.append(
            "trial-11", [KillRequested(trial_id=11, allocation_id=alloc, reason="kill")]
        )
    body = await api.ok(
        "POST",
        f"/api/v1/allocations/{alloc}/exited",
        token=api.agent,
        json={
            "agent_id": "gpu01",
            "exit_code": exit_code,
            "idempotency_key": "x",
            **({} if shutdown is None else {"agent_shutdown": shutdown}),
        },
    )
    assert body["outcome"] == outcome
    [exited] = [e for e in await store.read_stream("trial-11") if e.type == "TrialExited"]
    assert (exited.payload["outcome"], exited.payload["exit_code"]) == (outcome, exit_code)


async def test_exit_report_with_a_malformed_shutdown_flag_is_a_400(
    api: Api, store: EventStore
) -> None:
    """An exit report whose ``agent_shutdown`` is not a boolean is refused, naming the field,
    and records nothing."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    status, body = await api.call(
        "POST",
        f"/api/v1/allocations/{alloc}/exited",
        token=api.agent,
        json={"agent_id": "gpu01", "exit_code": 143, "agent_shutdown": {"x": 1}},
    )
    assert status == 400 and body["error"]["path"] == "agent_shutdown"
    assert "TrialExited" not in await types_of(store, "trial-11")


async def test_preemption_long_poll_wakes_on_request(api: Api, store: EventStore) -> None:
    """The long poll answers false at its timeout, and true as soon as PreemptionRequested is
    appended while it waits (long before its own timeout)."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    path = f"/api/v1/allocations/{alloc}/signals/preemption"
    token = api.trial_token(11)
    assert await api.ok("GET", f"{path}?timeout_seconds=0.3", token=token) == {
        "preempt": False,
        "current": True,
    }
    waiting = asyncio.create_task(api.ok("GET", f"{path}?timeout_seconds=60", token=token))
    # A second poll sent after it, and answered false at its own timeout, shows the first is
    # open at the server with nothing to report yet.
    assert await api.ok("GET", f"{path}?timeout_seconds=0.3", token=token) == {
        "preempt": False,
        "current": True,
    }
    assert not waiting.done()
    await store.append(
        "trial-11", [PreemptionRequested(trial_id=11, allocation_id=alloc, reason="pause")]
    )
    assert await asyncio.wait_for(waiting, 20) == {"preempt": True, "current": True}
    status, _ = await api.call("GET", f"{path}?timeout_seconds=-1", token=token)
    assert status == 400


async def test_preemption_poll_says_when_the_run_is_no_longer_current(
    api: Api, store: EventStore
) -> None:
    """Once the run's exit is recorded (here: declared lost), the long poll answers at once
    that it is no longer current (to the agent), and the run's own token is refused with 403,
    reason run_not_current, for the poll and for a report alike."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    token = api.trial_token(11)
    path = f"/api/v1/allocations/{alloc}/signals/preemption?timeout_seconds=30"
    assert await api.ok("GET", path.replace("30", "0"), token=token) == {
        "preempt": False,
        "current": True,
    }
    await store.append(
        "trial-11",
        [TrialExited(trial_id=11, run_id=1, allocation_id=alloc, outcome="lost")],
    )
    assert await api.ok("GET", path, token=api.agent) == {"preempt": True, "current": False}
    status, body = await api.call("GET", path, token=token)
    assert status == 403 and body["error"]["reason"] == "run_not_current", body
    item = {
        "kind": "metrics",
        "idempotency_key": "m1",
        "group": "training",
        "steps_completed": 5,
        "metrics": {"loss": 1.0},
        "run_id": 1,
    }
    status, body = await api.call(
        "POST", "/api/v1/trials/11/reports", token=token, json={"items": [item]}
    )
    assert status == 403 and body["error"]["reason"] == "run_not_current", body


async def test_logs_are_stored_once_per_key(api: Api, store: EventStore) -> None:
    """A log batch lands in task_logs; the same idempotency key again inserts nothing."""
    await submit_experiment(store)
    alloc = await allocate(store, 11)
    batch = {
        "idempotency_key": "log-1",
        "lines": [
            {"ts": 1700000000.5, "rank": 0, "stream": "stdout", "line": "hello"},
            {"line": "world", "stream": "stderr"},
        ],
    }
    path = f"/api/v1/allocations/{alloc}/logs"
    assert await api.ok("POST", path, token=api.trial_token(11), json=batch) == {"inserted": 2}
    assert await api.ok("POST", path, token=api.agent, json=batch) == {"inserted": 0}
    lines = await store.fetch("SELECT line FROM task_logs ORDER BY seq")
    assert [r["line"] for r in lines] == ["hello", "world"]
