"""/metrics, /healthz and /readyz on a live cluster of processes: every service serves them, an
experiment moves the queue and allocation gauges, consumer lag follows a killed and restarted
scheduler, a killed agent's heartbeat age grows until it is lost."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cairn.local.servers import ServerProcess
from events.log.store import EventStore
from tests.e2e.harness import first_trial, wait_for
from tests.e2e.observed import SERVICES, ObservedCluster, Scrape
from tests.e2e.test_trials import SCRIPTED, scripted

AGENT_TIMEOUT = 3.0


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[ObservedCluster]:
    """Relay, searcher, scheduler, tracker, API and a 1-slot agent, each serving its metrics."""
    c = ObservedCluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=1, agent_timeout=AGENT_TIMEOUT)
    try:
        await c.login()
        yield c
    finally:
        c.stop()


def long_trial(tmp_path: Path) -> dict[str, object]:
    """A one-slot trial that runs for minutes (it holds its slot through the test)."""
    return scripted(tmp_path / "ckpt", steps=100_000, sleep=0.05, checkpoint_every=100_000)


async def test_every_process_serves_parseable_metrics_and_is_ready(
    cluster: ObservedCluster,
) -> None:
    """Each service and the agent answer /healthz, turn ready on /readyz, and serve /metrics in
    Prometheus's format with their own series (appends, consumer lag, the agent's heartbeat)."""
    for name in ("api", *SERVICES, "agent-a"):
        await wait_for(cluster, lambda name=name: cluster.ready(name))
        status, _ = await cluster.get(name, "/healthz")
        assert status == 200, name
    api = await cluster.scrape("api")
    assert {"cairn_append_seconds_count", "cairn_http_request_seconds_count"} <= api.names()
    assert api.value("cairn_cluster_gauges_up") == 1
    scheduler = await cluster.scrape("scheduler")
    assert scheduler.value("cairn_consumer_lag_events", consumer="scheduler") is not None
    tracker = await cluster.scrape("tracker")
    for consumer in ("tracker-projections", "tracker-webhooks", "tracker-gc"):
        assert tracker.value("cairn_consumer_lag_events", consumer=consumer) is not None
    assert (await cluster.scrape("relay")).value("cairn_ready") == 1
    agent = await cluster.scrape("agent-a")
    assert agent.value("cairn_agent_registered") == 1
    assert agent.value("cairn_agent_slots") == 1


async def test_a_submitted_experiment_moves_the_allocation_slot_and_queue_gauges(
    cluster: ObservedCluster, store: EventStore, tmp_path: Path
) -> None:
    """A first experiment takes the only slot (an allocation, one slot used), a second waits
    (one trial queued in the default pool, waiting longer with time); latency is labelled by
    route template, never by an id."""
    first = await cluster.submit(long_trial(tmp_path), SCRIPTED)
    await first_trial(cluster, store, first)

    async def placed() -> Scrape | None:
        scrape = await cluster.scrape("api")
        used = scrape.value("cairn_slots", pool="default", state="used")
        allocated = sum(
            s.value
            for s in scrape.samples
            if s.name == "cairn_allocations" and s.labels["state"] != "TERMINATED"
        )
        return scrape if used == 1 and allocated == 1 else None

    before = await wait_for_value(cluster, placed)
    assert before.value("cairn_slots", pool="default", state="free") == 0
    assert (before.value("cairn_queue_waiting_trials", pool="default") or 0) == 0
    second = await cluster.submit(long_trial(tmp_path), SCRIPTED)
    await first_trial(cluster, store, second)

    async def queued() -> Scrape | None:
        scrape = await cluster.scrape("api")
        waiting = scrape.value("cairn_queue_waiting_trials", pool="default")
        return scrape if waiting == 1 else None

    waiting = await wait_for_value(cluster, queued)
    age = waiting.value("cairn_queue_oldest_wait_seconds", pool="default")
    assert age is not None

    async def older() -> bool:
        later = (await cluster.scrape("api")).value(
            "cairn_queue_oldest_wait_seconds", pool="default"
        )
        return later is not None and later > age

    await wait_for(cluster, older)
    await cluster.request("GET", f"/experiments/{second}")
    scrape = await cluster.scrape("api")
    assert (
        scrape.value(
            "cairn_http_request_seconds_count",
            method="GET",
            route="/api/v1/experiments/{experiment_id}",
            code="200",
        )
        or 0
    ) >= 1
    assert not [v for v in scrape.label_values() if re.search(rf"/{second}\b", v)]


async def test_consumer_lag_rises_while_the_scheduler_is_killed_and_falls_after_its_restart(
    cluster: ObservedCluster, store: EventStore, tmp_path: Path
) -> None:
    """SIGKILL the scheduler and append (an experiment and its trial request): the gateway's
    lag of consumer ``scheduler`` rises and stays while the tracker's does not; restarted, the
    scheduler catches up and its lag falls back to 0."""
    await wait_for(cluster, lambda: cluster.ready("scheduler"))
    cluster.kill("scheduler")
    experiment = await cluster.submit(long_trial(tmp_path), SCRIPTED)
    await first_trial(cluster, store, experiment)

    async def lagging() -> bool:
        scrape = await cluster.scrape("api")
        lag = scrape.value("cairn_consumer_lag_events", consumer="scheduler") or 0
        tracked = scrape.value("cairn_consumer_lag_events", consumer="tracker-projections")
        return lag >= 2 and tracked == 0

    await wait_for(cluster, lagging)
    cluster.start_observed("scheduler", "services.scheduler", "--agent-timeout", str(AGENT_TIMEOUT))

    async def caught_up() -> bool:
        scrape = await cluster.scrape("api")
        return scrape.value("cairn_consumer_lag_events", consumer="scheduler") == 0

    await wait_for(cluster, caught_up)
    await wait_for(cluster, lambda: cluster.ready("scheduler"))


async def test_a_killed_agent_shows_a_growing_heartbeat_age_then_is_lost(
    cluster: ObservedCluster,
) -> None:
    """SIGKILL the agent: the gateway's heartbeat age of ``agent-a`` grows past the scheduler's
    agent timeout, the agent is counted lost and its slot is no longer free."""

    async def beating() -> bool:
        scrape = await cluster.scrape("api")
        return (
            scrape.value("cairn_agents", pool="default", state="active") == 1
            and scrape.value("cairn_agent_heartbeat_age_seconds", agent="agent-a") is not None
        )

    await wait_for(cluster, beating)
    cluster.kill("agent-a")
    first = (await cluster.scrape("api")).value(
        "cairn_agent_heartbeat_age_seconds", agent="agent-a"
    )
    assert first is not None

    async def lost() -> bool:
        scrape = await cluster.scrape("api")
        age = scrape.value("cairn_agent_heartbeat_age_seconds", agent="agent-a") or 0
        return (
            age > max(first, AGENT_TIMEOUT)
            and scrape.value("cairn_agents", pool="default", state="lost") == 1
            and scrape.value("cairn_slots", pool="default", state="free") == 0
        )

    await wait_for(cluster, lost)


async def wait_for_value(cluster: ObservedCluster, probe: object) -> Scrape:
    """The first truthy answer of ``probe`` (failing with the services' logs on timeout)."""
    found: list[Scrape] = []

    async def check() -> bool:
        value = await probe()  # type: ignore[operator]
        if value is not None:
            found.append(value)
        return value is not None

    await wait_for(cluster, check)
    return found[0]
