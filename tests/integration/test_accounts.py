"""Accounts against the real gateway: user tokens expire and can be listed and revoked (API and
``cairn token``), failed logins are throttled per user and per address, passwords have a
minimum length, template YAML is parsed off the event loop, and an event-stream client that
stops reading is cut off with what it holds bounded, then resumes where it was."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import threading
import tracemalloc
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web

from cairn.cli import main as cli_main
from events.domain.config import safe_yaml
from events.domain.config.cluster import ClusterConfig, parse_cluster_config
from events.domain.types import TemplateSet
from events.log.store import EventStore
from services.api import routes_events
from services.api.app import create_app
from services.api.auth import cluster_secret, hash_token
from tests.helpers import ADMIN_PASSWORD, cli_env, wait_until
from tests.integration.test_api_event_stream import read_events
from tests.integration.test_api_support import TEST_CLUSTER, Api, running_api

ACCOUNTS = {
    "checkpoint_storage": TEST_CLUSTER.checkpoint_storage.model_dump(),
    "accounts": {
        "token_lifetime": "1h",
        "login_throttle": {
            "max_failures_per_user": 3,
            "max_failures_per_address": 6,
            "window": "10m",
        },
    },
}


def cluster(**accounts: Any) -> ClusterConfig:
    """The test cluster config with ``accounts`` settings over :data:`ACCOUNTS`'."""
    return parse_cluster_config({**ACCOUNTS, "accounts": {**ACCOUNTS["accounts"], **accounts}})


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store, cluster=cluster()) as client:
        yield client


async def add_user(api: Api, name: str, password: str | None = None) -> str:
    """Creates user ``name`` (password ``<name>-password``); returns the password."""
    password = password or f"{name}-password"
    await api.ok(
        "POST", "/api/v1/users", token=api.admin, json={"username": name, "password": password}
    )
    return password


async def login(api: Api, username: str, password: str) -> tuple[int, Any, dict[str, str]]:
    """A login attempt: status, body and response headers."""
    async with api.session.post(
        f"{api.url}/api/v1/auth/login", json={"username": username, "password": password}
    ) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def test_tokens_last_30_days_by_default_and_older_ones_get_a_lifetime(
    store: EventStore,
) -> None:
    """A login's token carries ``expires_at`` = now + 30 days by default; a token stored
    without an expiry gets the configured lifetime from its creation when the gateway starts
    (and is gone if that has passed)."""
    async with running_api(store) as api:
        status, body, _ = await login(api, "admin", ADMIN_PASSWORD)
        assert status == 200, body
        expires = datetime.fromisoformat(body["expires_at"])
        assert abs(expires - datetime.now(UTC) - timedelta(days=30)) < timedelta(minutes=5)
        for name, age in (("old-token", "2 hours"), ("recent-token", "1 minute")):
            await store.execute(
                "INSERT INTO api_tokens (token_hash, username, created_at) "
                f"VALUES ($1, 'admin', now() - interval '{age}')",
                hash_token(name),
            )
        assert (await api.call("GET", "/api/v1/me", token="old-token"))[0] == 200
    secret = await cluster_secret(store)
    restarted = web.AppRunner(create_app(store, None, secret=secret, cluster=cluster()))
    await restarted.setup()  # the gateway's start-up, lifetime "1h"
    await restarted.cleanup()
    rows = dict(
        await store.fetch(
            "SELECT token_hash, expires_at - created_at FROM api_tokens WHERE token_hash = ANY($1)",
            [hash_token("old-token"), hash_token("recent-token")],
        )
    )
    assert rows == {hash_token("recent-token"): timedelta(hours=1)}


async def test_a_token_stops_working_when_its_lifetime_ends(store: EventStore) -> None:
    """With a 2-second token lifetime a fresh token works, then is refused (401) once it has
    expired."""
    async with running_api(store, cluster=cluster(token_lifetime="2s")) as api:
        status, body, _ = await login(api, "admin", ADMIN_PASSWORD)
        assert status == 200, body
        token = body["token"]
        assert (await api.call("GET", "/api/v1/me", token=token))[0] == 200

        async def expired() -> bool:
            return (await api.call("GET", "/api/v1/me", token=token))[0] == 401

        await wait_until(expired, timeout=15)


async def test_users_list_and_revoke_their_tokens_and_admins_anyones(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob lists his two tokens (the one in use marked), revokes the other, which stops
    working; he may not see or revoke Carol's (403), an unknown id is 404; an admin lists
    everyone's and revokes Carol's; ``cairn token list|revoke`` do the same."""
    bob_pw, carol_pw = await add_user(api, "bob"), await add_user(api, "carol")
    first, second = await api.login("bob", bob_pw), await api.login("bob", bob_pw)
    carol = await api.login("carol", carol_pw)
    listed = (await api.ok("GET", "/api/v1/tokens", token=second))["tokens"]
    assert [(t["username"], t["current"]) for t in listed] == [("bob", True), ("bob", False)]
    assert all(t["expires_at"] for t in listed)
    assert first not in json.dumps(listed) and second not in json.dumps(listed)
    first_id = listed[1]["id"]
    carols = (await api.ok("GET", "/api/v1/tokens", token=carol))["tokens"][0]["id"]
    for method, path in (
        ("GET", "/api/v1/tokens?username=carol"),
        ("GET", "/api/v1/tokens?all=true"),
        ("DELETE", f"/api/v1/tokens/{carols}"),
    ):
        assert (await api.call(method, path, token=second))[0] == 403, path
    assert (await api.call("DELETE", "/api/v1/tokens/999999", token=second))[0] == 404
    assert await api.ok("DELETE", f"/api/v1/tokens/{first_id}", token=second) == {
        "id": first_id,
        "username": "bob",
    }
    assert (await api.call("GET", "/api/v1/me", token=first))[0] == 401
    assert (await api.call("GET", "/api/v1/me", token=second))[0] == 200

    everyone = (await api.ok("GET", "/api/v1/tokens?all=true", token=api.admin))["tokens"]
    assert {t["username"] for t in everyone} == {"admin", "bob", "carol"}
    await api.ok("DELETE", f"/api/v1/tokens/{carols}", token=api.admin)
    assert (await api.call("GET", "/api/v1/me", token=carol))[0] == 401

    cli_env(monkeypatch, tmp_path / "home", api.url, "bob", bob_pw)

    def run(*args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = cli_main(list(args))
        return code, out.getvalue()

    code, out = await asyncio.to_thread(run, "token", "list", "--json")
    assert code == 0, out
    mine = json.loads(out)["tokens"]
    current = [t["id"] for t in mine if t["current"]]
    assert len(current) == 1 and {t["username"] for t in mine} == {"bob"}
    code, out = await asyncio.to_thread(run, "token", "list")
    assert code == 0 and "EXPIRES" in out and str(current[0]) in out, out
    code, out = await asyncio.to_thread(run, "token", "revoke", str(carols + 1000))
    assert code == 4, out
    code, out = await asyncio.to_thread(run, "token", "revoke", str(current[0]))
    assert code == 0 and f"revoked token {current[0]} of bob" in out, out


async def test_failed_logins_are_throttled_per_user_and_per_address(api: Api) -> None:
    """Three failures for bob make his next login a 429 with Retry-After, even with the right
    password, while carol still logs in; a success clears only the user's own failures; six
    failures from one address throttle every username from it."""
    bob_pw, carol_pw = await add_user(api, "bob"), await add_user(api, "carol")
    for _ in range(2):
        assert (await login(api, "bob", "wrong"))[0] == 401
    assert (await login(api, "bob", bob_pw))[0] == 200  # a success clears bob's failures
    for _ in range(3):
        assert (await login(api, "bob", "wrong"))[0] == 401
    status, body, headers = await login(api, "bob", bob_pw)
    assert status == 429, body
    assert 1 <= int(headers["Retry-After"]) <= 600
    assert "too many failed logins" in body["error"]["message"]
    assert (await login(api, "carol", carol_pw))[0] == 200

    # The address has 3 failures counted (bob's); 3 more for other names reach its limit of 6.
    for name in ("mallory", "eve", "trudy"):
        assert (await login(api, name, "guess"))[0] == 401
    assert (await login(api, "carol", "wrong"))[0] == 429
    assert (await login(api, "carol", carol_pw))[0] == 429
    assert (await login(api, "someone-new", "x"))[0] == 429


async def test_passwords_shorter_than_the_minimum_are_400(api: Api) -> None:
    """Creating a user or changing a password with fewer than 8 characters is a 400 naming
    the field and saying the minimum; 8 is enough."""
    for password in ("", "x", "seven77"):
        status, body = await api.call(
            "POST",
            "/api/v1/users",
            token=api.admin,
            json={"username": "dave", "password": password},
        )
        assert (status, body["error"]["path"]) == (400, "password"), body
        assert "at least 8 characters" in body["error"]["message"] or not password
    await add_user(api, "dave", "eight888")
    dave = await api.login("dave", "eight888")
    status, body = await api.call(
        "POST",
        "/api/v1/users/dave/password",
        token=dave,
        json={"password": "short", "old_password": "eight888"},
    )
    assert (status, body["error"]["path"]) == (400, "password"), body
    assert body["error"]["message"] == "password: must be at least 8 characters, got 5"


async def test_template_yaml_is_parsed_off_the_event_loop(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting a template from YAML text and creating an experiment from YAML over a template
    parse every document on a worker thread, never on the gateway's event loop."""
    threads: set[int] = set()
    compose = safe_yaml._Loader.compose_node

    def recording(self: Any, *args: Any) -> Any:
        threads.add(threading.get_ident())
        return compose(self, *args)

    monkeypatch.setattr(safe_yaml._Loader, "compose_node", recording)
    await api.ok(
        "PUT",
        "/api/v1/templates/base",
        token=api.admin,
        json={"config": "max_restarts: 2\nresources: {slots_per_trial: 1}\n"},
    )
    config = (
        "name: t\nentrypoint: python train.py\nhyperparameters: {lr: 0.1}\n"
        "searcher: {name: single, metric: loss, max_length: {batches: 10}}\n"
    )
    await api.ok(
        "POST",
        "/api/v1/experiments",
        token=api.admin,
        json={"config": config, "template": "base"},
    )
    assert threads and threading.get_ident() not in threads


def open_stream(api: Api) -> socket.socket:
    """A client that asks for the whole event stream and then never reads (a tiny receive
    buffer, so the server's writes back up at once)."""
    host, port = api.url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(
        (
            f"GET /api/v1/events/stream HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {api.admin}\r\n\r\n"
        ).encode()
    )
    return sock


def served(api: Api, client: socket.socket) -> bool:
    """Whether the gateway (in this process) still holds its end of ``client``'s connection."""
    port = int(api.url.rsplit(":", 1)[1])
    mine = client.getsockname()[1]
    return any(
        c.laddr and c.laddr.port == port and c.raddr and c.raddr.port == mine
        and c.status == psutil.CONN_ESTABLISHED
        for c in psutil.Process().net_connections(kind="tcp")
    )  # fmt: skip


def drain(sock: socket.socket) -> bytes:
    """Everything the server sent until it closed the connection."""
    sock.settimeout(30)
    chunks = []
    while data := sock.recv(1 << 20):
        chunks.append(data)
    return b"".join(chunks)


async def test_an_event_stream_client_that_never_reads_is_cut_off_and_resumes(
    api: Api, store: EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 40 events of ~400 KiB in the log, a client that stops reading makes the gateway
    hold about a page (not the log) and is disconnected once a page waits too long; it
    resumes with Last-Event-ID from the last event it got and receives the rest."""
    monkeypatch.setattr(routes_events, "SLOW_READER_SECONDS", 1.0)
    blob = "x" * 400_000
    for i in range(40):
        await store.append(
            f"template-big{i}",
            [TemplateSet(name=f"big{i}", config={"description": blob}, owner="admin")],
        )
    head = await store.head()
    tracemalloc.start()
    try:
        sock = open_stream(api)
        await wait_until(lambda: served(api, sock), timeout=10)
        await wait_until(lambda: not served(api, sock), timeout=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        received = await asyncio.to_thread(drain, sock)
    finally:
        sock.close()
    assert peak < 24 * (1 << 20), f"the gateway held {peak / (1 << 20):.1f} MiB"
    text = received.decode(errors="replace")
    complete = [int(block.split("\n", 1)[0][4:]) for block in text.split("\n\n")
                if block.startswith("id: ") and "\ndata: " in block and block.endswith("}")]  # fmt: skip
    last = max(complete, default=0)
    assert last < head, "the slow client was cut off before the end of the log"
    rest = await read_events(api, api.admin, head - last, last_event_id=last, timeout=60)
    assert [int(e["id"]) for e in rest] == list(range(last + 1, head + 1))
