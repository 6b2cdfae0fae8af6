"""Experiments through the API gateway: submission, code storage, and user state actions."""

from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import AsyncIterator

import aiohttp
import pytest

from events.domain.types import ExperimentStateChanged
from events.log.store import EventStore
from services.api.auth import create_user
from tests.integration.test_api_support import CONFIG, Api, running_api


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def test_create_appends_experiment_submitted(api: Api, store: EventStore) -> None:
    """A valid config and code become ExperimentSubmitted (validated config, owner, code ref)."""
    code = gzip.compress(b"fake tar")
    body = await api.ok(
        "POST",
        "/api/v1/experiments",
        token=api.admin,
        json={"config": CONFIG, "code": base64.b64encode(code).decode(), "activate": False},
    )
    events = await store.read_stream(f"experiment-{body['id']}")
    assert [e.type for e in events] == ["ExperimentSubmitted"]
    payload = events[0].payload
    assert payload["owner"] == "admin" and payload["activate"] is False
    assert payload["config"]["searcher"]["name"] == "single"
    assert payload["config"]["reproducibility"]["experiment_seed"] is not None
    assert payload["code_ref"] == "sha256:" + hashlib.sha256(code).hexdigest() == body["code_ref"]
    status, blob = await api.call("GET", f"/api/v1/code/{body['code_ref']}", token=api.agent)
    assert status == 200 and blob == code
    view = await api.ok("GET", f"/api/v1/experiments/{body['id']}", token=api.admin)
    assert view["state"] == "PAUSED"


async def test_create_accepts_multipart_with_raw_tarball(api: Api, store: EventStore) -> None:
    """A multipart form with the config text and a raw tar.gz part is accepted like JSON."""
    code = gzip.compress(b"multipart tar")
    form = aiohttp.FormData()
    form.add_field("config", CONFIG)
    form.add_field("code", code, filename="code.tar.gz", content_type="application/gzip")
    form.add_field("activate", "true")
    status, body = await api.call("POST", "/api/v1/experiments", token=api.admin, data=form)
    assert status == 200, body
    events = await store.read_stream(f"experiment-{body['id']}")
    assert events[0].payload["code_ref"] == "sha256:" + hashlib.sha256(code).hexdigest()


async def test_bad_config_is_400_with_its_path(api: Api, store: EventStore) -> None:
    """An invalid config is refused with 400 naming the config path, and nothing but the three
    refusals' audit records is appended."""
    bad = CONFIG.replace("name: single", "name: singel")
    status, body = await api.call(
        "POST", "/api/v1/experiments", token=api.admin, json={"config": bad}
    )
    assert status == 400
    assert body["error"]["path"].startswith("searcher")
    status, body = await api.call(
        "POST", "/api/v1/experiments", token=api.admin, json={"config": {"searcher": 3}}
    )
    assert status == 400 and body["error"]["path"] == "searcher"
    status, body = await api.call(
        "POST", "/api/v1/experiments", token=api.admin, json={"config": CONFIG, "code": "!!"}
    )
    assert status == 400 and body["error"]["path"] == "code"
    assert [e.type for e in await store.read_all(0)] == ["RequestRejected"] * 3


async def test_pause_activate_and_terminal_409(api: Api, store: EventStore) -> None:
    """Pause and activate append state changes; a repeat is a no-op; terminal states refuse 409."""
    exp = (await api.ok("POST", "/api/v1/experiments", token=api.admin, json={"config": CONFIG}))[
        "id"
    ]
    base = f"/api/v1/experiments/{exp}"
    assert (await api.ok("POST", f"{base}/pause", token=api.admin))["state"] == "PAUSED"
    assert (await api.ok("POST", f"{base}/pause", token=api.admin))["changed"] is False
    assert (await api.ok("POST", f"{base}/activate", token=api.admin))["state"] == "ACTIVE"
    assert (await api.ok("POST", f"{base}/cancel", token=api.admin))["state"] == "STOPPING_CANCELED"
    status, _ = await api.call("POST", f"{base}/pause", token=api.admin)
    assert status == 409
    assert (await api.ok("POST", f"{base}/kill", token=api.admin))["state"] == "STOPPING_KILLED"
    await store.append(
        f"experiment-{exp}", [ExperimentStateChanged(experiment_id=exp, state="CANCELED")]
    )
    for action in ("pause", "activate", "cancel", "kill"):
        status, body = await api.call("POST", f"{base}/{action}", token=api.admin)
        assert status == 409, (action, body)
    states = [e.payload.get("state") for e in await store.read_stream(f"experiment-{exp}")]
    assert states == [None, "PAUSED", "ACTIVE", "STOPPING_CANCELED", "STOPPING_KILLED", "CANCELED"]


async def test_only_owner_or_admin_may_act(api: Api, store: EventStore) -> None:
    """Another user gets 403 on someone else's experiment and its code; agents cannot create."""
    code = base64.b64encode(gzip.compress(b"x")).decode()
    body = await api.ok(
        "POST", "/api/v1/experiments", token=api.admin, json={"config": CONFIG, "code": code}
    )
    assert await create_user(store, "bob", "pw", admin=False)
    bob = await api.login("bob", "pw")
    status, _ = await api.call("POST", f"/api/v1/experiments/{body['id']}/pause", token=bob)
    assert status == 403
    status, _ = await api.call("GET", f"/api/v1/code/{body['code_ref']}", token=bob)
    assert status == 403
    status, _ = await api.call(
        "POST", "/api/v1/experiments", token=api.agent, json={"config": CONFIG}
    )
    assert status == 403
    status, _ = await api.call("POST", "/api/v1/experiments/999/pause", token=api.admin)
    assert status == 404
