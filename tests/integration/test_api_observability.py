"""Who may read the gateway's /metrics (an admin or the metrics token, nobody else), the public
probes, and what its exposition holds: series labelled by route template, no user's data."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from events.log.store import EventStore
from tests.e2e.observed import parse
from tests.integration.test_api_support import Api, running_api, submit_experiment

METRICS_TOKEN = "scraper-token-for-tests-0123456789"


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store, metrics_token=METRICS_TOKEN) as client:
        yield client


async def test_metrics_refuses_anonymous_users_agents_and_trials(api: Api) -> None:
    """/metrics answers 401 without a token or with a wrong one, 403 to a user who is not an
    admin, an agent and a trial; the probes answer anyone."""
    await api.ok(
        "POST",
        "/api/v1/users",
        token=api.admin,
        json={"username": "bob", "password": "bob-password-1"},
    )
    bob = await api.login("bob", "bob-password-1")
    status, _ = await api.call("GET", "/metrics")
    assert status == 401
    status, _ = await api.call("GET", "/metrics", token=METRICS_TOKEN + "x")
    assert status == 401
    for token in (bob, api.agent, api.trial_token(11)):
        status, body = await api.call("GET", "/metrics", token=token)
        assert status == 403, body
    assert (await api.call("GET", "/healthz"))[0] == 200
    status, body = await api.call("GET", "/readyz")
    assert status == 200 and body["checks"]["database"] == "ok"


async def test_an_admin_and_the_metrics_token_read_the_exposition(
    api: Api, store: EventStore
) -> None:
    """An admin's token and the metrics token both read /metrics, which parses as Prometheus's
    format, counts requests by route template (never by the id asked for) and holds no user's
    name."""
    await submit_experiment(store, experiment_id=4321, owner="admin")
    await api.call("GET", "/api/v1/experiments/98765", token=api.admin)
    for token in (api.admin, METRICS_TOKEN):
        status, body = await api.call("GET", "/metrics", token=token)
        assert status == 200
        scrape = parse(body.decode())
    assert scrape.value("cairn_cluster_gauges_up") == 1
    assert scrape.value("cairn_append_batch_events_count") is not None
    routes = {
        s.labels["route"] for s in scrape.samples if s.name == "cairn_http_request_seconds_count"
    }
    assert "/api/v1/experiments/{experiment_id}" in routes
    values = scrape.label_values()
    assert not [v for v in values if "98765" in v or "4321" in v or v == "admin"], values
