"""Oversized input at the gateway: an event over the store's limit and a body over its route's
limit are refused with 413 naming what was too large, nothing is recorded, and the next
experiment goes through the log and the bus as usual."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from cairn.local.servers import ServerProcess
from events.domain.config.limits import MAX_CONFIG_CHARS
from events.log.bus import EVENTS_STREAM, POSITION_HEADER, STUB_HEADER, Bus, subject_for
from events.log.consumer import ConsumerRunner
from events.log.limits import MAX_EVENT_BYTES
from events.log.relay import CHECKPOINT as RELAY_CHECKPOINT
from events.log.relay import Relay
from events.log.store import EventStore
from services.api.limits import DEFAULT_MAX_BODY
from services.searcher.service import SearcherConsumer
from tests.helpers import wait_until
from tests.integration.test_api_support import (
    CONFIG,
    Api,
    allocate,
    running_api,
    submit_experiment,
)

BIG = "x" * (2 * 1024 * 1024)


@dataclass
class Cluster:
    """The gateway, plus a relay and a searcher that only the bus wakes."""

    api: Api
    store: EventStore
    bus: Bus


@pytest.fixture
async def cluster(store: EventStore, nats_server: ServerProcess) -> AsyncIterator[Cluster]:
    relay_bus = await Bus.connect(nats_server.url)
    searcher_bus = await Bus.connect(nats_server.url)
    stop = asyncio.Event()
    searcher = ConsumerRunner(store, searcher_bus, SearcherConsumer(store), catch_up_every=3600.0)
    tasks = [
        asyncio.create_task(Relay(store, relay_bus).run(stop)),
        asyncio.create_task(searcher.run(stop)),
    ]
    try:
        async with running_api(store) as api:
            yield Cluster(api, store, relay_bus)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await relay_bus.close()
        await searcher_bus.close()


def config_with(**fields: Any) -> str:
    """The test config with extra top-level fields, as YAML (JSON is YAML)."""
    import yaml

    config = yaml.safe_load(CONFIG)
    config.update(fields)
    return json.dumps(config)


async def submitted(store: EventStore) -> list[int]:
    """The experiments the log has accepted."""
    return [e.payload["experiment_id"] for e in await store.read_all(types=["ExperimentSubmitted"])]


async def create(api: Api, config: str, code: bytes | None = None) -> tuple[int, Any]:
    body: dict[str, Any] = {"config": config}
    if code is not None:
        body["code"] = base64.b64encode(code).decode()
    return await api.call("POST", "/api/v1/experiments", token=api.admin, json=body)


@pytest.mark.parametrize("size", [700 * 1024, 2 * 1024 * 1024])
async def test_big_description_is_413_and_the_next_experiment_runs(
    cluster: Cluster, size: int
) -> None:
    """A description over the event limit (700 KB) or over the config limit too (2 MB) gets 413
    naming config.description, records nothing (not even the code), and the next experiment is
    accepted, relayed whole and gets its trial requested."""
    api, store = cluster.api, cluster.store
    config = config_with(description="x" * size)
    status, body = await create(api, config, gzip.compress(b"code"))
    assert status == 413, body
    error = body["error"]
    assert error["part"] == "config.description", error
    if size < MAX_CONFIG_CHARS:  # refused when the event is built, not by the config's limits
        assert "config.description" in error["message"]
        assert "ExperimentSubmitted" in error["message"]
        assert error["size"] > error["limit"] == MAX_EVENT_BYTES
    assert await submitted(store) == []
    assert await store.fetchval("SELECT count(*) FROM code_blobs") == 0

    status, body = await create(api, config_with(description="fine"))
    assert status == 200, body
    experiment_id = body["id"]
    [accepted] = await store.read_stream(f"experiment-{experiment_id}")

    async def trial_requested() -> bool:
        events = await store.read_all(types=["TrialRequested"])
        return any(e.payload["experiment_id"] == experiment_id for e in events)

    await wait_until(trial_requested, timeout=60)
    assert await store.checkpoint(RELAY_CHECKPOINT) >= accepted.position
    msg = await cluster.bus.js.get_msg(  # the first message on the experiment's subject
        EVENTS_STREAM, seq=1, subject=subject_for(accepted.stream_id), next=True
    )
    assert msg.headers is not None and STUB_HEADER not in msg.headers
    assert msg.headers[POSITION_HEADER] == str(accepted.position)
    assert json.loads(msg.data or b"")["payload"]["config"]["description"] == "fine"


@pytest.mark.parametrize(
    ("fields", "part"),
    [
        ({"name": BIG}, "config.name"),
        ({"hyperparameters": {"lr": 0.1, "notes": BIG}}, "config.hyperparameters.notes"),
        ({"labels": ["a", BIG]}, "config.labels[1]"),
    ],
)
async def test_oversized_config_fields_are_413(
    cluster: Cluster, fields: dict[str, Any], part: str
) -> None:
    """A 2 MB name, hyperparameter or label is refused with 413 naming it; nothing appended."""
    status, body = await create(cluster.api, config_with(**fields))
    assert status == 413, body
    assert body["error"]["part"].startswith(part), body["error"]
    assert await submitted(cluster.store) == []


async def test_oversized_report_is_413_and_the_trial_reports_on(cluster: Cluster) -> None:
    """A report whose event would be 2 MB (checkpoint metadata, or a metrics report with many
    values) is 413; nothing is appended and the trial's next report is accepted."""
    api, store = cluster.api, cluster.store
    await submit_experiment(store)
    await allocate(store, 11)
    before = await store.read_stream("trial-11")
    path = "/api/v1/trials/11/reports"
    token = api.trial_token(11)
    checkpoint = {
        "kind": "checkpoint",
        "idempotency_key": "c1",
        "uuid": api.checkpoint_uuid(11),
        "metadata": {"steps_completed": 10, "notes": BIG},
    }
    many = {f"m{i:06d}": 1.0 for i in range(120_000)}
    metrics = {
        "kind": "metrics",
        "idempotency_key": "m1",
        "group": "validation",
        "steps_completed": 10,
        "metrics": many,
    }
    for item, part in ((checkpoint, "metadata.notes"), (metrics, "metrics")):
        status, body = await api.call("POST", path, token=token, json={"items": [item]})
        assert status == 413, body
        assert body["error"]["part"] == part
        assert await store.read_stream("trial-11") == before
    small = {**metrics, "idempotency_key": "m2", "metrics": {"loss": 0.5}}
    status, body = await api.call("POST", path, token=token, json={"items": [small]})
    assert (status, body["events"]) == (200, 1)


async def test_body_over_the_route_limit_is_413(cluster: Cluster) -> None:
    """A body over its route's limit is 413 whether it declares its length or is chunked, and a
    multipart config part is bounded too; the gateway still serves the next request."""
    api = cluster.api
    big = json.dumps({"username": "admin", "password": BIG}).encode()
    assert len(big) > DEFAULT_MAX_BODY
    status, body = await api.call("POST", "/api/v1/auth/login", data=big)
    assert status == 413, body
    assert "limit" in body["error"]["message"]

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 64 * 1024):
            yield big[i : i + 64 * 1024]

    status, body = await api.call("POST", "/api/v1/users", token=api.admin, data=chunks())
    assert status == 413, body

    form = aiohttp.FormData()
    form.add_field("config", config_with(description=BIG))
    form.add_field("code", gzip.compress(b"x"), filename="c.tar.gz")
    status, body = await api.call("POST", "/api/v1/experiments", token=api.admin, data=form)
    assert status == 413, body
    assert "config" in body["error"]["message"]
    assert await submitted(cluster.store) == []
    assert await api.login()
