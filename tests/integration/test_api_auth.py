"""API gateway auth against a real server and PostgreSQL: tokens, scopes, OpenAPI coverage."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from events.domain.types import ExperimentSubmitted
from events.log.envelope import NewEvent
from events.log.store import EventStore
from services.api.app import all_routes
from services.api.errors import error_middleware
from tests.helpers import spawn, wait_until
from tests.integration.test_api_support import Api, allocate, running_api, submit_experiment


def metric_with(steps: int) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "idempotency_key": "m",
        "group": "training",
        "steps_completed": steps,
        "metrics": {"loss": 1.0},
    }


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def test_health_is_public_and_everything_else_needs_a_token(api: Api) -> None:
    """Health answers without a token; other endpoints answer 401 JSON without or with a bad one."""
    assert await api.ok("GET", "/api/v1/health") == {"status": "ok"}
    status, body = await api.call("GET", "/api/v1/me")
    assert status == 401 and "message" in body["error"]
    status, _ = await api.call("GET", "/api/v1/me", token="not-a-token")
    assert status == 401
    status, _ = await api.call("POST", "/api/v1/agents/a/register", json={"slots": []})
    assert status == 401


async def test_login_issues_a_token_and_wrong_password_is_401(api: Api) -> None:
    """The initial admin logs in with the password it was given; a wrong one gets 401."""
    me = await api.ok("GET", "/api/v1/me", token=api.admin)
    assert me == {"kind": "user", "username": "admin", "admin": True}
    status, _ = await api.call(
        "POST", "/api/v1/auth/login", json={"username": "admin", "password": "nope"}
    )
    assert status == 401
    status, body = await api.call("POST", "/api/v1/auth/login", json={"username": "admin"})
    assert status == 400 and body["error"]["path"] == "password"


async def test_logout_revokes_the_token(api: Api) -> None:
    """After logout the same user token is refused."""
    token = await api.login()
    await api.ok("POST", "/api/v1/auth/logout", token=token)
    status, _ = await api.call("GET", "/api/v1/me", token=token)
    assert status == 401


async def test_trial_token_cannot_touch_another_trial(api: Api, store: EventStore) -> None:
    """A trial token reaches its own trial and allocation but gets 403 for any other."""
    await submit_experiment(store)
    mine = await allocate(store, 11)
    other = await allocate(store, 12)
    token = api.trial_token(11)
    assert (await api.ok("GET", "/api/v1/me", token=token))["trial_id"] == 11
    await api.ok("GET", f"/api/v1/allocations/{mine}/signals/preemption", token=token)
    status, _ = await api.call("GET", f"/api/v1/allocations/{other}/spec", token=token)
    assert status == 403
    item = {"kind": "progress", "idempotency_key": "p", "progress": 0.5}
    status, _ = await api.call(
        "POST", "/api/v1/trials/12/reports", token=token, json={"items": [item]}
    )
    assert status == 403
    status, _ = await api.call("POST", "/api/v1/agents/x/heartbeat", token=token, json={})
    assert status == 403
    forged = token[:-1] + ("0" if token[-1] != "0" else "1")
    status, _ = await api.call("GET", "/api/v1/me", token=forged)
    assert status == 401


async def test_openapi_documents_every_route_with_request_schemas(api: Api) -> None:
    """The OpenAPI document lists every served route, and each route with a body has a schema."""
    doc = await api.ok("GET", "/api/v1/openapi.json", token=api.admin)
    assert doc["openapi"].startswith("3.")
    for route in all_routes():
        op = doc["paths"][route.path][route.method.lower()]
        if route.body is not None:
            ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[-1] in doc["components"]["schemas"]
    reports = doc["paths"]["/api/v1/trials/{trial_id}/reports"]["post"]
    assert reports["parameters"][0]["name"] == "trial_id"


async def test_unknown_route_and_bad_json_are_json_errors(api: Api) -> None:
    """An unknown path is a JSON 404 and a malformed body a JSON 400, never a 500."""
    status, body = await api.call("GET", "/api/v1/nothing-here", token=api.admin)
    assert status == 404 and "error" in body
    status, body = await api.call(
        "POST",
        "/api/v1/experiments",
        token=api.admin,
        data=b"{not json",
    )
    assert status == 400 and "error" in body


async def test_service_process_serves_with_env_credentials(
    db_url: str, service_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    """``python -m services.api`` without NATS serves HTTP, honouring CAIRN_ADMIN_PASSWORD and
    CAIRN_AGENT_TOKEN (as the join token: it opens only the join), and announces readiness."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = tmp_path / "ready"
    env = service_env(
        CAIRN_ADMIN_PASSWORD="s3cret", CAIRN_AGENT_TOKEN="agent-tok", CAIRN_READY_FILE=str(ready)
    )
    proc = spawn("services.api", "--db", db_url, "--port", str(port), env=env)
    try:
        await wait_until(ready.exists, timeout=20)
        url = f"http://127.0.0.1:{port}/api/v1"
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{url}/auth/login", json={"username": "admin", "password": "s3cret"}
            ) as resp:
                assert resp.status == 200
            joiner = {"Authorization": "Bearer agent-tok"}
            async with session.get(f"{url}/me", headers=joiner) as resp:
                assert resp.status == 403
            async with session.post(f"{url}/agents/a1/join", headers=joiner, json={}) as resp:
                token = (await resp.json())["token"]
            async with session.get(
                f"{url}/me", headers={"Authorization": f"Bearer {token}"}
            ) as resp:
                assert (await resp.json()) == {"kind": "agent", "agent_id": "a1"}
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


async def answer_through_middleware(handler: Any) -> tuple[int, Any]:
    """Serves ``handler`` behind the error middleware alone; returns one GET's status and JSON."""
    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/once", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{host}:{port}/once") as resp,
        ):
            return resp.status, await resp.json()
    finally:
        await runner.cleanup()


async def test_unexpected_exception_becomes_logged_json_500() -> None:
    """A handler crash leaves the error middleware as a JSON 500 without internals."""

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("secret internals")

    status, body = await answer_through_middleware(boom)
    assert status == 500
    assert body == {"error": {"message": "internal server error"}}


async def test_duplicate_event_is_a_409_not_a_503(store: EventStore) -> None:
    """An append reusing a stored event id answers 409 naming the id, not 503 "retry later"."""
    item = NewEvent(event=ExperimentSubmitted(experiment_id=1, config={}))
    await store.append("experiment-1", [item])

    async def append_again(request: web.Request) -> web.Response:
        await store.append("experiment-1", [item])
        return web.json_response({})

    status, body = await answer_through_middleware(append_again)
    assert status == 409, body
    assert str(item.event_id) in body["error"]["message"]
    assert len(await store.read_stream("experiment-1")) == 1


async def test_garbage_input_never_causes_a_500(api: Api, store: EventStore) -> None:
    """Every route answers malformed bodies, queries and ids with a 4xx JSON error, never a 500."""
    await submit_experiment(store)
    await allocate(store, 11)
    bodies: list[Any] = [
        None,
        [],
        "x",
        {"items": [{"kind": "metrics", "idempotency_key": "k\u0000", "group": "g"}]},
        {"items": [metric_with(steps=10**30)], "slots": [{"slot_id": "\u0000"}], "lines": [1]},
        {"config": {"searcher": {"name": "single", "metric": "\u0000"}}, "running": "x"},
        {"lines": [{"line": "x", "rank": 10**12}], "idempotency_key": "k", "exit_code": "x"},
        {  # valid for each route except for NUL characters, which PostgreSQL refuses
            "slots": [{"slot_id": "\u0000"}],
            "running": ["\u0000"],
            "lines": [{"line": "x"}],
            "idempotency_key": "k\u0000",
            "agent_id": "gpu01",
            "exit_code": 0,
            "items": [{**metric_with(steps=1), "idempotency_key": "k\u0000"}],
            "config": "name: \u0000",
        },
        {  # the same with lone surrogates, which UTF-8 (and so PostgreSQL) cannot encode
            "slots": [{"slot_id": "\ud800"}],
            "running": ["\udfff"],
            "lines": [{"line": "\ud800"}],
            "idempotency_key": "k\ud800",
            "agent_id": "gpu01",
            "exit_code": 0,
            "items": [{**metric_with(steps=1), "idempotency_key": "k\udc00"}],
            "config": {"name": "\ud800", "searcher": {"name": "single", "metric": "m"}},
            "username": "\ud800",
            "password": "\ud800",
        },
    ]
    ids = {
        "experiment_id": ["1", "x", "99999999999999999999"],
        "agent_id": ["a", "%00", "."],
        "allocation_id": ["11.1", "11", "x"],
        "trial_id": ["11", "1", "x.y"],
        "code_ref": ["sha256:00", "%00"],
    }
    query = "?timeout_seconds=nan&archived=maybe&group=%00&agent_id=%00"
    for route in all_routes():
        if route.path.endswith("/logout"):
            continue  # would revoke the token the rest of the loop uses
        for value_set in range(2):
            path = route.path
            for name, values in ids.items():
                path = path.replace("{" + name + "}", values[value_set % len(values)])
            for body in bodies if route.method == "POST" else [None]:
                status, answer = await api.call(
                    route.method, path + query, token=api.admin, json=body
                )
                assert status < 500, (route.method, path, body, answer)
                assert status == 200 or "error" in answer
