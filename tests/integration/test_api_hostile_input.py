"""Hostile configs and bodies against the real gateway on real PostgreSQL: each is a clear 4xx,
nothing is appended, and the event loop keeps answering while a config is parsed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from events.domain.config.limits import MAX_CONFIG_NODES
from events.log.store import EventStore
from services.api.app import all_routes
from services.api.errors import MAX_JSON_DEPTH
from tests.helpers import wait_until
from tests.integration.test_api_support import (
    CONFIG,
    Api,
    allocate,
    running_api,
    submit_experiment,
)
from tests.unit.test_config_limits import BILLION_LAUGHS

HEALTH = "/api/v1/health"
RANDOM = "searcher: {name: random, metric: loss, max_trials: 2, max_length: {batches: 10}}\n"


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def stored_besides_refusals(store: EventStore) -> list[str]:
    """The types of the logged events other than the gateway's records of refused requests."""
    return [e.type for e in await store.read_all(0) if e.type != "RequestRejected"]


async def _create(api: Api, config: object) -> tuple[int, dict[str, object]]:
    status, body = await api.call(
        "POST", "/api/v1/experiments", token=api.admin, json={"config": config}
    )
    assert isinstance(body, dict)
    return status, body


async def test_alias_bomb_is_refused_fast_while_health_keeps_answering(
    api: Api, store: EventStore
) -> None:
    """A 450-byte alias bomb is a 400 within a second, and /health answers within 100 ms
    throughout the request (the old code expanded it on the event loop for seconds)."""
    latencies: list[float] = []
    done = asyncio.Event()

    async def poll_health() -> None:
        while not done.is_set():
            started = time.monotonic()
            status, _ = await api.call("GET", HEALTH)
            latencies.append(time.monotonic() - started)
            assert status == 200

    poller = asyncio.create_task(poll_health())
    await wait_until(lambda: latencies, every=0.01)
    started = time.monotonic()
    status, body = await _create(api, BILLION_LAUGHS)
    elapsed = time.monotonic() - started
    seen = len(latencies)
    await wait_until(lambda: len(latencies) >= seen + 2, every=0.01)  # samples after it too
    done.set()
    await poller
    assert status == 400, body
    error = body["error"]
    assert isinstance(error, dict) and error["path"] == "<config>"
    assert f"expand to more than {MAX_CONFIG_NODES} values" in str(error["message"])
    assert elapsed < 1.0, elapsed
    assert max(latencies) < 0.1, latencies
    assert await stored_besides_refusals(store) == []


async def test_a_large_config_is_parsed_off_the_event_loop(api: Api, store: EventStore) -> None:
    """While a large config (50k values, invalid only at its end) is parsed, the gateway keeps
    answering /health: many health checks complete before the config's 400 (the test shares the
    gateway's event loop, so a parse on that loop would let none through while it runs)."""
    values = ",".join(["1"] * (MAX_CONFIG_NODES // 2))
    big = f"data: {{values: [{values}]}}\n" + RANDOM.replace("max_trials: 2", "max_trials: 0")
    create = asyncio.create_task(_create(api, big))
    answered = 0
    while not create.done():
        status, _ = await api.call("GET", HEALTH)
        assert status == 200
        answered += 1
        await asyncio.sleep(0.005)  # pacing only: leaves the parsing thread most of the CPU
    status, body = await create
    assert status == 400 and body["error"] == {
        "message": "invalid config: searcher.max_trials: must be >= 1, got 0",
        "path": "searcher.max_trials",
        "errors": [{"path": "searcher.max_trials", "message": "must be >= 1, got 0"}],
    }
    assert answered >= 20, answered
    assert await stored_besides_refusals(store) == []


async def test_max_trials_two_to_the_seventy_is_400_with_its_path(
    api: Api, store: EventStore
) -> None:
    """``max_trials: 2**70`` is refused with 400 at searcher.max_trials, as text and as data."""
    text = RANDOM.replace("max_trials: 2", f"max_trials: {2**70}")
    for config in (text, {"searcher": {"name": "random", "metric": "m", "max_trials": 2**70}}):
        status, body = await _create(api, config)
        assert status == 400, body
        error = body["error"]
        assert isinstance(error, dict) and error["path"] == "searcher.max_trials"
        assert f"must be <= 100000, got {2**70}" in str(error["message"])
    assert await stored_besides_refusals(store) == []


async def test_lone_surrogates_are_400_naming_the_field(api: Api, store: EventStore) -> None:
    """A lone surrogate in an experiment name (JSON or YAML escape), a heartbeat or a username
    is a 400 naming the field, never a 500 from the database."""
    as_data = {"name": "bad \ud800", "searcher": {"name": "single", "metric": "m"}}
    status, body = await _create(api, as_data)
    assert status == 400 and body["error"] == {
        "message": "config.name: text may not contain a lone surrogate (U+D800), it is not Unicode",
        "path": "config.name",
    }
    status, body = await _create(api, CONFIG.replace("name: mnist", 'name: "bad \\udc00"'))
    error = body["error"]
    assert status == 400 and isinstance(error, dict) and error["path"] == "name"
    status, body = await api.call(
        "POST", "/api/v1/agents/gpu01/heartbeat", token=api.agent, json={"running": ["\udfff"]}
    )
    assert status == 400 and body["error"]["path"] == "running[0]"
    status, body = await api.call(
        "POST", "/api/v1/users", token=api.admin, json={"username": "\ud800", "password": "x"}
    )
    assert status == 400 and body["error"]["path"] == "username"
    assert await stored_besides_refusals(store) == []


async def test_unstorable_text_in_a_report_batch_is_400_however_it_is_encoded(
    api: Api, store: EventStore
) -> None:
    """Text PostgreSQL cannot store, in a checkpoint's free-form metadata (which no model
    checks), is a 400 naming the field whether it is escaped (``\\u0000``, ``\\ud800``) or
    raw: a surrogate's UTF-8 bytes (json decodes them with ``surrogatepass``) or a UTF-16
    body; no checkpoint is appended."""
    await submit_experiment(store)
    await allocate(store, 11)
    token = api.trial_token(11)
    head = '{"items": [{"kind": "checkpoint", "uuid": "c1", "idempotency_key": "k", '
    head += '"metadata": {"steps_completed": 1, "note": "x'
    tail = '"}}]}'
    raw = {
        "escaped NUL": (head + "\\u0000" + tail).encode(),
        "escaped surrogate": (head + "\\ud800" + tail).encode(),
        "raw surrogate, UTF-8": (head + "\ud800" + tail).encode("utf-8", "surrogatepass"),
        "raw surrogate, UTF-16": (head + "\ud800" + tail).encode("utf-16-le", "surrogatepass"),
    }
    for name, data in raw.items():
        status, body = await api.call("POST", "/api/v1/trials/11/reports", token=token, data=data)
        assert status == 400, (name, status, body)
        assert body["error"]["path"] == "items[0].metadata.note", (name, body)
    assert "CheckpointSaved" not in await stored_besides_refusals(store)


async def test_a_config_too_large_is_413(api: Api, store: EventStore) -> None:
    """A config with more values than the limit is refused with 413, naming the limit."""
    values = ",".join(["1"] * (MAX_CONFIG_NODES + 1))
    status, body = await _create(api, RANDOM + f"data: {{values: [{values}]}}\n")
    assert status == 413, body
    assert f"more than {MAX_CONFIG_NODES} values" in str(body["error"])
    assert await stored_besides_refusals(store) == []


async def test_a_body_of_100000_nested_brackets_is_400_on_every_route(
    api: Api, store: EventStore
) -> None:
    """100,000 nested ``[`` (and a list nested just past the limit) answer 400 on every POST
    route, never a RecursionError turned 500."""
    too_deep = ("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)).encode()
    for route in all_routes():
        if route.method != "POST" or route.path.endswith("/logout"):
            continue
        path = route.path
        for name, value in {
            "experiment_id": "1",
            "agent_id": "gpu01",
            "allocation_id": "11.1",
            "trial_id": "11",
            "task_id": "0123456789abcdef",
            "slot_id": "0",
            "username": "admin",
            "workspace": "1",
            "project": "1",
            "group": "1",
            "pool": "gpu",
            "webhook_id": "1",
            "name": "some-model",
        }.items():
            path = path.replace("{" + name + "}", value)
        for raw in (b"[" * 100_000, too_deep):
            status, body = await api.call("POST", path, token=api.admin, data=raw)
            assert status == 400, (path, status, body)
            assert "nested" in body["error"]["message"], (path, body)
    assert await stored_besides_refusals(store) == []
