"""Webhooks over the real API, PostgreSQL and HTTP: the tracker's consumer and sender (run in
this process) deliver what the log says to a real receiver, signed, once each and in order per
webhook; a hanging or failing receiver holds up no other webhook; URLs outside the allow-list
or inside the cluster are refused at creation, and a name that resolves inside the cluster is
refused when the delivery is sent; roles decide who sees and edits which webhook."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from cairn.cli import main as cli_main
from events.domain.config.cluster import WebhookPolicy, parse_cluster_config
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    ExperimentStateChanged,
    TrialAlerted,
    TrialRequested,
    TrialStateChanged,
)
from events.domain.webhooks.urls import Endpoints
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
from services.tracker import webhooks as tracker_webhooks
from services.tracker.webhook_sender import WebhookSender
from services.tracker.webhooks import WebhookConsumer
from services.webhooks import signing
from tests.helpers import cli_env, wait_until
from tests.integration.test_api_support import CONFIG, TEST_CLUSTER, Api, running_api
from tests.integration.test_api_teams import grant, user
from tests.integration.webhook_receiver import HOST, Receiver, Seen, free_port

ALIAS = "receiver.test"
"""A name the tests' resolver maps to an address of their choosing."""


@dataclass
class Env:
    """A running API whose cluster config allows the receiver, and the receiver."""

    api: Api
    store: EventStore
    receiver: Receiver
    api_port: int


def sender_policy(**changes: Any) -> WebhookPolicy:
    """The tracker's webhook policy in these tests: the receiver's address only, fast retries."""
    base: dict[str, Any] = {
        "allowed_networks": [f"{HOST}/32"],
        "retry_delay": "0.05s",
        "max_retry_delay": "0.2s",
        "max_attempts": 3,
        "timeout": "5s",
    }
    return parse_cluster_config({"webhooks": {**base, **changes}}).webhooks


@pytest.fixture
async def env(store: EventStore) -> AsyncIterator[Env]:
    receiver = Receiver()
    await receiver.start()
    api_port = free_port("127.0.0.1")
    cluster = TEST_CLUSTER.model_copy(
        update={
            "webhooks": parse_cluster_config(
                {
                    "webhooks": {
                        "allowed_urls": [
                            f"http://{HOST}:{receiver.port}/",
                            f"http://{ALIAS}:{receiver.port}/",
                            f"http://127.0.0.1:{api_port}/",
                            f"http://localhost:{api_port}/",
                            "http://[::1]:9/",
                            "http://169.254.169.254/",
                        ],
                        # The API's own loopback address is allowed as a network here, so that
                        # refusing it shows the rule for the cluster's own services.
                        "allowed_networks": ["127.0.0.0/8"],
                    }
                }
            ).webhooks
        }
    )
    await tracker_webhooks.migrate(store)
    try:
        async with running_api(store, cluster=cluster, port=api_port) as api:
            yield Env(api, store, receiver, api_port)
    finally:
        await receiver.stop()


class MappedResolver(AbstractResolver):
    """Resolves every name to the address in :attr:`address` (what DNS says right now)."""

    def __init__(self, address: str) -> None:
        self.address = address

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {
                "hostname": host,
                "host": self.address,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
        ]

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def delivering(
    store: EventStore, policy: WebhookPolicy, resolver: AbstractResolver | None = None
) -> AsyncIterator[ConsumerRunner]:
    """The tracker's webhook consumer and sender, running until the block ends."""
    stop = asyncio.Event()
    sender = WebhookSender(store, policy, Endpoints(), resolver=resolver, poll_every=0.1)
    runner = ConsumerRunner(
        store, None, WebhookConsumer(policy, on_queued=sender.wake), catch_up_every=0.1
    )
    tasks = [asyncio.create_task(runner.run(stop)), asyncio.create_task(sender.run(stop))]
    try:
        yield runner
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def create_hook(api: Api, token: str, **body: Any) -> dict[str, Any]:
    """Creates a webhook; returns the answer (with its signing key)."""
    body.setdefault("triggers", [{"trigger_type": "EXPERIMENT_STATE_CHANGE",
                                  "condition": {"state": "COMPLETED"}}])  # fmt: skip
    status, answer = await api.call("POST", "/api/v1/webhooks", token=token, json=body)
    assert status == 200, (status, answer)
    return dict(answer)


async def experiment(api: Api, name: str, extra: str = "", workspace: str = "") -> int:
    """Creates an experiment (not activated) through the API; returns its id."""
    text = CONFIG.replace("name: mnist", f"name: {name}")
    if workspace:
        text += f"workspace: {workspace}\nproject: {workspace}-p\n"
    answer = await api.ok(
        "POST", "/api/v1/experiments", token=api.admin,
        json={"config": text + extra, "activate": True},
    )  # fmt: skip
    assert not [w for w in answer.get("warnings", []) if "integrations" in str(w)], answer
    return int(answer["id"])


async def trials(store: EventStore, experiment_id: int, count: int) -> list[int]:
    """Appends ``count`` TrialRequested of the experiment; returns their ids."""
    ids = [experiment_id * 1000 + n for n in range(1, count + 1)]
    await store.append(
        experiment_stream(experiment_id),
        [
            TrialRequested(
                experiment_id=experiment_id, trial_id=t, seq=n, request_id=f"r{t}",
                hparams={}, trial_seed=1,
            )
            for n, t in enumerate(ids)
        ],
    )  # fmt: skip
    return ids


async def trial_states(store: EventStore, trial_id: int, *states: str) -> None:
    await store.append(
        trial_stream(trial_id), [TrialStateChanged(trial_id=trial_id, state=s) for s in states]
    )


async def experiment_states(store: EventStore, experiment_id: int, *states: str) -> None:
    await store.append(
        experiment_stream(experiment_id),
        [ExperimentStateChanged(experiment_id=experiment_id, state=s) for s in states],
    )


async def rows(store: EventStore, webhook_id: int) -> list[dict[str, Any]]:
    """The webhook's delivery rows in log order."""
    found = await store.fetch(
        "SELECT * FROM webhook_deliveries WHERE webhook_id = $1 ORDER BY position", webhook_id
    )
    return [dict(r) for r in found]


def verified(seen: Seen, key: str) -> bool:
    """Whether both signature headers (cairn's and Determined's) verify under ``key``."""
    h = seen.headers
    return signing.verify(
        key, h["X-Cairn-Signature-Timestamp"], seen.body, h["X-Cairn-Signature"]
    ) and signing.verify(
        key, h["X-Determined-AI-Signature-Timestamp"], seen.body, h["X-Determined-AI-Signature"]
    )


async def workspace(api: Api, name: str) -> None:
    await api.ok("POST", "/api/v1/workspaces", token=api.admin, json={"name": name})
    await api.ok(
        "POST", f"/api/v1/workspaces/{name}/projects", token=api.admin, json={"name": f"{name}-p"}
    )


async def test_state_changes_reach_the_receiver_signed_once_each_in_order(env: Env) -> None:
    """A workspace webhook gets its experiment's trial and experiment completions in log order,
    each once, signed under its own key with cairn's and Determined's headers, the delivery id
    in the header and the body; a global Slack webhook gets a Block Kit message; the list shows
    how the deliveries went."""
    api, store, receiver = env.api, env.store, env.receiver
    await workspace(api, "vision")
    w1 = await create_hook(
        api, api.admin, name="ops", url=receiver.url("ok", "w1"), workspace="vision",
        triggers=[
            {"trigger_type": "TRIAL_STATE_CHANGE", "condition": {"state": "COMPLETED"}},
            {"trigger_type": "TRIGGER_TYPE_EXPERIMENT_STATE_CHANGE",
             "condition": {"state": "COMPLETED"}},
        ],
    )  # fmt: skip
    w2 = await create_hook(
        api,
        api.admin,
        name="slack",
        url=receiver.url("ok", "w2"),
        webhook_type="WEBHOOK_TYPE_SLACK",
    )
    assert w1["workspace"] == "vision" and w2["workspace_id"] is None
    exp = await experiment(api, "det", workspace="vision")
    ids = await trials(store, exp, 3)
    async with delivering(store, sender_policy()):
        for trial_id in reversed(ids):
            await trial_states(store, trial_id, "STOPPING_COMPLETED", "COMPLETED")
        await experiment_states(store, exp, "STOPPING_COMPLETED", "COMPLETED")

        async def all_delivered() -> bool:
            done = await rows(store, w1["id"]) + await rows(store, w2["id"])
            return len(done) == 5 and all(r["state"] == "delivered" for r in done)

        await wait_until(all_delivered, timeout=30)
    got = receiver.seen["w1"]
    assert [s.json["event_type"] for s in got] == ["TRIAL_STATE_CHANGE"] * 3 + [
        "EXPERIMENT_STATE_CHANGE"
    ]
    assert [s.json["event_data"]["experiment"].get("trial_id") for s in got] == [
        *reversed(ids),
        None,
    ]
    assert all(s.json["condition"] == {"state": "COMPLETED"} for s in got)
    last = got[-1].json
    assert last["event_data"]["experiment"]["workspace"] == "vision"
    assert last["event_data"]["experiment"]["project"] == "vision-p"
    assert last["event_data"]["experiment"]["name"] == "det"
    for seen in got:
        assert seen.delivery_id == seen.json["delivery_id"] == seen.json["event_id"]
        assert verified(seen, w1["signing_key"])
        assert not verified(seen, w2["signing_key"])  # each webhook has its own key
    assert len({s.delivery_id for s in got}) == 4
    [slack] = receiver.seen["w2"]
    assert verified(slack, w2["signing_key"])
    assert "✅" in slack.json["attachments"][0]["blocks"][0]["text"]["text"]
    assert slack.json["attachments"][0]["color"] == "#13B670"
    listed = await env.api.ok("GET", "/api/v1/webhooks", token=api.admin)
    record = {h["name"]: h["delivery"] for h in listed["webhooks"]}
    assert record["ops"]["delivered"] == 4 and record["ops"]["last_status"] == 200
    assert record["slack"]["delivered"] == 1


async def test_a_workspace_webhook_hears_only_the_tasks_of_its_workspace(env: Env) -> None:
    """A workspace webhook's task trigger fires for a task started in its workspace and not for
    one in the default workspace; a global one fires for both; the payload names the task's
    workspace."""
    api, store, receiver = env.api, env.store, env.receiver
    await workspace(api, "vision")
    queued = [{"trigger_type": "TASK_STATE_CHANGE", "condition": {"state": "QUEUED"}}]
    scoped = await create_hook(
        api, api.admin, name="vision-tasks", url=receiver.url("ok", "scoped"),
        workspace="vision", triggers=queued,
    )  # fmt: skip
    everywhere = await create_hook(
        api, api.admin, name="all-tasks", url=receiver.url("ok", "all"), triggers=queued
    )
    inside = await api.ok(
        "POST", "/api/v1/commands", token=api.admin, json={"argv": ["true"], "workspace": "vision"}
    )
    outside = await api.ok("POST", "/api/v1/commands", token=api.admin, json={"argv": ["true"]})
    async with delivering(store, sender_policy()) as runner:

        async def delivered() -> bool:
            done = await rows(store, scoped["id"]) + await rows(store, everywhere["id"])
            return len(done) == 3 and all(r["state"] == "delivered" for r in done)

        await wait_until(delivered, timeout=30)
        assert await runner.catch_up() == await store.head()
    assert len(await rows(store, scoped["id"])) == 1
    [heard] = [s.json["event_data"]["task"] for s in receiver.seen["scoped"]]
    assert (heard["task_id"], heard["workspace_id"]) == (inside["id"], inside["workspace_id"])
    assert [s.json["event_data"]["task"]["task_id"] for s in receiver.seen["all"]] == [
        inside["id"],
        outside["id"],
    ]


async def test_a_hanging_and_a_failing_receiver_delay_no_other_webhook(env: Env) -> None:
    """With one receiver that never answers and one that answers 500, a third webhook still
    gets all its deliveries while the hanging one's first attempt is in flight; the failing
    one's deliveries end failed after the bounded attempts; the log's consumer is at the head."""
    api, store, receiver = env.api, env.store, env.receiver
    trigger = [{"trigger_type": "TRIAL_STATE_CHANGE", "condition": {"state": "COMPLETED"}}]
    hang = await create_hook(api, api.admin, name="hang", url=receiver.url("hang", "h"),
                             triggers=trigger)  # fmt: skip
    fail = await create_hook(api, api.admin, name="fail", url=receiver.url("fail", "f"),
                             triggers=trigger)  # fmt: skip
    good = await create_hook(api, api.admin, name="good", url=receiver.url("ok", "g"),
                             triggers=trigger)  # fmt: skip
    exp = await experiment(api, "busy")
    ids = await trials(store, exp, 5)
    # The hanging receiver's attempt ends only after a timeout longer than this test waits.
    async with delivering(store, sender_policy(timeout="600s")) as runner:
        for trial_id in ids:
            await trial_states(store, trial_id, "COMPLETED")

        async def others_done() -> bool:
            good_rows = await rows(store, good["id"])
            fail_rows = await rows(store, fail["id"])
            return (
                len(good_rows) == 5
                and all(r["state"] == "delivered" for r in good_rows)
                and len(fail_rows) == 5
                and all(r["state"] == "failed" for r in fail_rows)
            )

        await wait_until(others_done, timeout=60)
        hang_rows = await rows(store, hang["id"])
        assert len(receiver.seen["h"]) == 1  # its first attempt is still waiting for an answer
        assert [r["state"] for r in hang_rows] == ["pending"] * 5
        assert hang_rows[0]["attempts"] == 0
        assert await runner.catch_up() == await store.head()
    assert [s.json["event_data"]["experiment"]["trial_id"] for s in receiver.seen["g"]] == ids
    assert len(receiver.seen["f"]) == 5 * 3  # three attempts each, the same id each time
    assert [s.delivery_id for s in receiver.seen["f"]][:3] == [
        receiver.seen["f"][0].delivery_id
    ] * 3
    fail_rows = await rows(store, fail["id"])
    assert all(r["attempts"] == 3 and r["last_status"] == 500 for r in fail_rows)
    listed = await api.ok("GET", "/api/v1/webhooks", token=api.admin)
    record = {h["name"]: h["delivery"] for h in listed["webhooks"]}
    assert record["fail"]["failed"] == 5 and "500" in record["fail"]["last_error"]


async def test_a_name_resolving_inside_the_cluster_is_refused_at_send_time(env: Env) -> None:
    """A webhook naming a host that resolved to the receiver is delivered; once the name
    resolves to 127.0.0.1 (DNS rebinding), the next delivery is refused on that address and
    never reaches it; a URL change points the pending deliveries elsewhere."""
    api, store, receiver = env.api, env.store, env.receiver
    hook = await create_hook(
        api, api.admin, name="dns", url=receiver.url("ok", "dns", host=ALIAS),
        triggers=[{"trigger_type": "EXPERIMENT_STATE_CHANGE", "condition": {"state": "PAUSED"}},
                  {"trigger_type": "EXPERIMENT_STATE_CHANGE", "condition": {"state": "ACTIVE"}}],
    )  # fmt: skip
    resolver = MappedResolver(HOST)
    exp = await experiment(api, "rebind")
    async with delivering(store, sender_policy(), resolver):
        await experiment_states(store, exp, "PAUSED")
        await wait_until(lambda: len(receiver.seen["dns"]) == 1, timeout=30)
        resolver.address = "127.0.0.1"
        await experiment_states(store, exp, "ACTIVE")

        async def refused() -> dict[str, Any] | None:
            found = await rows(store, hook["id"])
            return found[1] if len(found) == 2 and found[1]["state"] == "failed" else None

        row = await wait_until(refused, timeout=30)
    assert "resolves to 127.0.0.1" in row["last_error"] and "loopback" in row["last_error"]
    assert row["attempts"] == 1  # a refused address is final
    assert len(receiver.seen["dns"]) == 1
    assert receiver.seen["dns"][0].json["condition"] == {"state": "PAUSED"}
    listed = await api.ok("GET", "/api/v1/webhooks", token=api.admin)
    [shown] = listed["webhooks"]
    assert "resolves to 127.0.0.1" in shown["delivery"]["last_error"]


async def test_the_test_route_sends_one_signed_delivery_and_reports_the_answer(env: Env) -> None:
    """POST /webhooks/{id}/test posts a signed test body and answers how the receiver
    answered: 200 is ok, 500 is reported as an error; the signing key route gives the key the
    signature verifies with."""
    api, receiver = env.api, env.receiver
    good = await create_hook(api, api.admin, name="t1", url=receiver.url("ok", "t1"))
    bad = await create_hook(api, api.admin, name="t2", url=receiver.url("fail", "t2"))
    answer = await api.ok("POST", f"/api/v1/webhooks/{good['id']}/test", token=api.admin, json={})
    assert answer["ok"] and answer["status"] == 200 and answer["error"] == ""
    [seen] = receiver.seen["t1"]
    assert seen.json["event_data"] == {"data": "test"}
    assert seen.delivery_id == answer["delivery_id"]
    key = await api.ok("GET", f"/api/v1/webhooks/{good['id']}/signing-key", token=api.admin)
    assert key["signing_key"] == good["signing_key"] and verified(seen, key["signing_key"])
    answer = await api.ok("POST", f"/api/v1/webhooks/{bad['id']}/test", token=api.admin, json={})
    assert not answer["ok"] and answer["status"] == 500 and "500" in answer["error"]


async def test_urls_outside_the_allow_list_or_inside_the_cluster_are_refused(env: Env) -> None:
    """At creation and on a URL change: a URL outside webhooks.allowed_urls, the API's own
    address (by address or by a name resolving to it), loopback and link-local addresses,
    credentials in the URL and malformed triggers answer 400 naming the problem; nothing is
    recorded."""
    api, receiver = env.api, env.receiver
    own = f"http://127.0.0.1:{env.api_port}/api/v1/auth/login"
    cases = [
        ({"url": "https://evil.example/hook"}, "webhooks.allowed_urls"),
        ({"url": own}, "the API of this cluster"),
        ({"url": f"http://localhost:{env.api_port}/x"}, "the API of this cluster"),
        ({"url": "http://[::1]:9/x"}, "loopback"),
        ({"url": "http://169.254.169.254/latest/meta-data"}, "link-local"),
        ({"url": f"http://user:pw@{HOST}:{receiver.port}/ok/x"}, "user name or password"),
        ({"url": "ftp://files.example/x"}, "http://"),
        ({"url": receiver.url("ok", "x"), "triggers": []}, "at least one trigger"),
        ({"url": receiver.url("ok", "x"), "triggers": [{"trigger_type": "CUSTOM"}]}, "specific"),
        ({"url": receiver.url("ok", "x"), "triggers": [
            {"trigger_type": "EXPERIMENT_STATE_CHANGE", "condition": {"state": "DONE"}}]},
         "not a state"),
        ({"url": receiver.url("ok", "x"), "triggers": [{"trigger_type": "METRIC"}]}, "not one of"),
        ({"url": receiver.url("ok", "x"), "mode": "sometimes"}, "mode"),
        ({"url": receiver.url("ok", "x"), "secret": "x"}, "secret"),
        ({"url": receiver.url("ok", "x") + "a" * 5000}, "url"),
    ]  # fmt: skip
    for change, expected in cases:
        body = {
            "name": "bad",
            "triggers": [
                {"trigger_type": "EXPERIMENT_STATE_CHANGE", "condition": {"state": "ERROR"}}
            ],
            **change,
        }
        status, answer = await api.call("POST", "/api/v1/webhooks", token=api.admin, json=body)
        assert status == 400 and expected in answer["error"]["message"], (change, answer)
    listed = await api.ok("GET", "/api/v1/webhooks", token=api.admin)
    assert listed["webhooks"] == []
    hook = await create_hook(api, api.admin, name="fine", url=receiver.url("ok", "fine"))
    status, answer = await api.call(
        "PATCH", f"/api/v1/webhooks/{hook['id']}", token=api.admin, json={"url": own}
    )
    assert status == 400 and "the API of this cluster" in answer["error"]["message"]
    status, _ = await api.call(
        "POST", "/api/v1/webhooks", token=api.admin,
        json={"name": "fine", "url": receiver.url("ok", "again"), "triggers": body["triggers"]},
    )  # fmt: skip
    assert status == 409  # the name is taken among the global webhooks


async def test_roles_decide_who_sees_and_edits_which_webhook(env: Env) -> None:
    """A Viewer cannot create; a WorkspaceAdmin of A creates in A but cannot create in B nor
    touch B's webhooks (not even see B or them), nor create a global one; a Viewer of A lists A's
    webhooks and the global ones with their URLs reduced to the origin."""
    api, receiver = env.api, env.receiver
    await workspace(api, "a")
    await workspace(api, "b")
    alice = await user(api, "alice")
    vic = await user(api, "vic")
    await grant(api, "WorkspaceAdmin", "alice", "a")
    await grant(api, "Viewer", "vic", "a")
    body = {"name": "hook", "url": receiver.url("ok", "r"), "workspace": "a",
            "triggers": [{"trigger_type": "EXPERIMENT_STATE_CHANGE",
                          "condition": {"state": "ERROR"}}]}  # fmt: skip
    status, answer = await api.call("POST", "/api/v1/webhooks", token=vic, json=body)
    assert status == 403 and "edit_webhooks" in answer["error"]["message"]
    in_a = await create_hook(api, alice, **body)
    status, _ = await api.call(
        "POST", "/api/v1/webhooks", token=alice, json={**body, "workspace": "b"}
    )
    assert status == 404  # a workspace alice cannot see is not shown to exist
    status, _ = await api.call(
        "POST", "/api/v1/webhooks", token=alice, json={**body, "workspace": None}
    )
    assert status == 403
    in_b = await create_hook(api, api.admin, **{**body, "workspace": "b"})
    glob = await create_hook(api, api.admin, **{**body, "workspace": None, "name": "global"})
    for method, path, payload in (
        ("PATCH", f"/api/v1/webhooks/{in_b['id']}", {"url": receiver.url("ok", "x")}),
        ("DELETE", f"/api/v1/webhooks/{in_b['id']}", None),
        ("POST", f"/api/v1/webhooks/{in_b['id']}/test", {}),
        ("GET", f"/api/v1/webhooks/{in_b['id']}/signing-key", None),
    ):
        status, _ = await api.call(method, path, token=alice, json=payload)
        assert status == 404, (method, path, status)
    for method, path, payload in (
        ("DELETE", f"/api/v1/webhooks/{glob['id']}", None),
        ("DELETE", f"/api/v1/webhooks/{in_a['id']}", None),
    ):
        status, _ = await api.call(method, path, token=vic, json=payload)
        assert status == 403, (method, path, status)
    listed = await api.ok("GET", "/api/v1/webhooks", token=alice)
    assert {h["id"] for h in listed["webhooks"]} == {in_a["id"], glob["id"]}
    seen = await api.ok("GET", "/api/v1/webhooks", token=vic)
    shown = {h["id"]: h for h in seen["webhooks"]}
    assert set(shown) == {in_a["id"], glob["id"]}
    assert shown[in_a["id"]]["url"] == f"http://{HOST}:{receiver.port}/…"
    assert not shown[in_a["id"]]["editable"]
    status, answer = await api.call("DELETE", f"/api/v1/webhooks/{in_a['id']}", token=alice)
    assert status == 200 and answer["deleted"]


async def test_specific_webhooks_fire_only_for_experiments_that_name_them(env: Env) -> None:
    """A specific webhook hears the alerts and completion of the experiment whose config names
    it, nothing of one that names none, and nothing of one that names it but excludes all."""
    api, store, receiver = env.api, env.store, env.receiver
    hook = await create_hook(
        api, api.admin, name="pager", url=receiver.url("ok", "pager"), mode="specific",
        triggers=[{"trigger_type": "CUSTOM"},
                  {"trigger_type": "EXPERIMENT_STATE_CHANGE", "condition": {"state": "COMPLETED"}}],
    )  # fmt: skip
    named = await experiment(api, "named", "integrations: {webhooks: {webhook_name: [pager]}}\n")
    other = await experiment(api, "other")
    excluded = await experiment(
        api,
        "excluded",
        f"integrations: {{webhooks: {{webhook_id: [{hook['id']}], exclude: true}}}}\n",
    )
    async with delivering(store, sender_policy()) as runner:
        for exp in (named, other, excluded):
            [trial_id] = await trials(store, exp, 1)
            await store.append(
                trial_stream(trial_id),
                [TrialAlerted(trial_id=trial_id, run_id=1, title="loss", description="nan",
                              level="warn")],
            )  # fmt: skip
            await experiment_states(store, exp, "STOPPING_COMPLETED", "COMPLETED")

        async def delivered() -> bool:
            found = await rows(store, hook["id"])
            return len(found) == 2 and all(r["state"] == "delivered" for r in found)

        await wait_until(delivered, timeout=30)
        assert await runner.catch_up() == await store.head()
    assert len(await rows(store, hook["id"])) == 2
    got = [s.json for s in receiver.seen["pager"]]
    assert [g["event_type"] for g in got] == ["CUSTOM", "EXPERIMENT_STATE_CHANGE"]
    assert got[0]["event_data"]["custom_data"] == {
        "title": "loss", "description": "nan", "level": "WARNING",
    }  # fmt: skip
    assert {g["event_data"]["experiment"]["id"] for g in got} == {named}


async def test_the_cli_creates_lists_tests_and_deletes_webhooks(
    env: Env, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``cairn webhook create|list|test|signing-key|delete`` against the real API: the key it
    prints verifies the test delivery's signature, a bad trigger is a usage error."""
    api, receiver = env.api, env.receiver
    cli_env(monkeypatch, tmp_path / "home", api.url)

    def run(*args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = cli_main(list(args))
        return code, out.getvalue()

    code, out = await asyncio.to_thread(
        run, "webhook", "create", "cli", receiver.url("ok", "cli"),
        "--trigger", "trial:COMPLETED", "--trigger", "experiment:ERROR",
    )  # fmt: skip
    assert code == 0, out
    found = re.search(r"webhook cli created \(id (\d+)\).* key ([0-9a-f]{64})", out)
    assert found, out
    webhook_id, key = found.groups()
    [made] = (await api.ok("GET", "/api/v1/webhooks", token=api.admin))["webhooks"]
    assert [t["trigger_type"] for t in made["triggers"]] == [
        "TRIAL_STATE_CHANGE",
        "EXPERIMENT_STATE_CHANGE",
    ]
    code, out = await asyncio.to_thread(run, "webhook", "list")
    assert code == 0 and "cli" in out and "trial:COMPLETED" in out, out
    code, out = await asyncio.to_thread(run, "webhook", "test", webhook_id)
    assert code == 0 and "answered 200" in out, out
    assert verified(receiver.seen["cli"][0], key)
    code, out = await asyncio.to_thread(run, "webhook", "signing-key", webhook_id)
    assert code == 0 and key in out, out
    code, out = await asyncio.to_thread(
        run, "webhook", "create", "x", receiver.url("ok", "x"), "--trigger", "metric:HIGH"
    )
    assert code != 0 and "--trigger" in out, out
    code, out = await asyncio.to_thread(run, "webhook", "delete", webhook_id, "--yes")
    assert code == 0, out
    assert (await api.ok("GET", "/api/v1/webhooks", token=api.admin))["webhooks"] == []
