"""The bus as a cluster: a search runs on three nats-servers (JetStream replicas 3) while the
server leading the events stream is SIGKILLed; the search completes, the log and the tracker's
tables are exact, and the bus holds every event once."""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest

from cairn.local.servers import NatsCluster, ServerProcess
from cairn.local.stopping import terminate
from events.domain.check import check_log
from events.log.bus import EVENTS_STREAM, connect_options, server_urls
from events.log.relay import CHECKPOINT as RELAY_CHECKPOINT
from events.log.store import EventStore
from services.tracker import projections
from tests.e2e.harness import Cluster, events_of, experiment_state, trial_ids
from tests.e2e.test_trials import SCRIPTED, scripted
from tests.helpers import wait_until
from tests.integration.test_tracker import snapshot

TRIALS = 8
STALL_BOUND = 30.0
"""Seconds the search may wait on the bus after its leader dies: JetStream elects a new leader
among the two survivors and the clients reconnect to one of them within a few."""


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_cluster: NatsCluster, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Relay, searcher, scheduler, tracker, API and one 4-slot agent, as processes, each given
    every NATS server's address."""
    c = Cluster(db_url, nats_cluster.url, tmp_path)
    c.start_all(slots=4)
    c.start("tracker", "services.tracker")
    try:
        await c.login()
        yield c
    finally:
        c.stop()


async def stream_info(url: str) -> Any:
    """The events stream's info, asked of whichever member answers."""
    nc = await nats.connect(**connect_options(url), connect_timeout=5, max_reconnect_attempts=3)
    try:
        return await nc.jetstream(timeout=5).stream_info(EVENTS_STREAM)
    finally:
        await nc.close()


async def leader_of(url: str) -> str | None:
    """The member leading the events stream, or ``None`` while the cluster elects one (the
    request then times out or is refused)."""
    try:
        info = await stream_info(url)
    except nats.errors.Error:
        return None
    return str(info.cluster.leader) if info.cluster and info.cluster.leader else None


def client_names(server: ServerProcess) -> set[str]:
    """The names of the clients connected to ``server`` (its monitoring port's ``/connz``)."""
    url = f"http://127.0.0.1:{server.extra['http_port']}/connz?limit=1024"
    with urllib.request.urlopen(url, timeout=5) as resp:
        connz = json.loads(resp.read())
    return {str(c.get("name", "")) for c in connz.get("connections") or []} - {""}


async def completed_trials(store: EventStore) -> set[int]:
    return {
        int(e.payload["trial_id"])
        for e in await events_of(store, "TrialExited")
        if e.payload["outcome"] == "completed"
    }


async def test_search_survives_sigkill_of_the_stream_leader_losing_and_repeating_nothing(
    cluster: Cluster, store: EventStore, nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    """An 8-trial search on a three-server NATS cluster: SIGKILL of the events stream's leader
    mid-search moves leadership to a survivor, events flow again within the bound, the search
    completes, every client that was connected is connected to a survivor,
    ``events.check`` finds nothing, the tracker's tables equal a rebuild from the log
    and the stream holds each event exactly once."""
    assert len(server_urls(nats_cluster.url)) == 3
    config = scripted(tmp_path / "ckpt", steps=40, sleep=0.02, report_every=5, checkpoint_every=10)
    config["searcher"] = {
        "name": "random",
        "metric": "validation_loss",
        "max_trials": TRIALS,
        "max_concurrent_trials": 4,
    }
    exp = await cluster.submit(config, SCRIPTED)

    def detail() -> str:
        servers = "\n".join(
            f"== {s.name}\n{s.log_path.read_text(errors='replace')[-1500:]}"
            for s in nats_cluster.servers
        )
        return f"{cluster.logs()}\n{servers}"

    async def some_completed() -> bool:
        return len(await completed_trials(store)) >= 2

    await wait_until(some_completed, timeout=120, every=0.2, detail=detail)
    info = await stream_info(nats_cluster.url)
    assert info.config.num_replicas == 3, "the services made the stream with three copies"
    leader = nats_cluster.member(info.cluster.leader)
    clients = set().union(*(client_names(s) for s in nats_cluster.servers))
    assert {"relay", "searcher", "scheduler", "tracker", "api"} <= clients, clients
    cut_off = client_names(leader)
    leader.kill()
    assert not leader.alive() and leader.proc.returncode == -signal.SIGKILL
    assert await experiment_state(store, exp) != "COMPLETED", "the fault lands mid-search"
    head_at_kill = await store.head()

    async def recovered() -> bool:
        moved = await leader_of(nats_cluster.url)
        relayed = await store.checkpoint(RELAY_CHECKPOINT)
        return moved not in (None, leader.name) and relayed > head_at_kill

    await wait_until(recovered, timeout=STALL_BOUND, every=0.2, detail=detail)
    survivors = [s for s in nats_cluster.servers if s is not leader]

    def reconnected() -> bool:
        return clients <= set().union(*(client_names(s) for s in survivors))

    await wait_until(reconnected, timeout=STALL_BOUND, every=0.2, detail=detail)
    print(f"killed {leader.name} (clients cut off: {sorted(cut_off)}); all reconnected")

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_until(completed, timeout=180, every=0.2, detail=detail)
    assert len(await trial_ids(store, exp)) == TRIALS
    assert len(await completed_trials(store)) == TRIALS
    assert await check_log(store) == []
    terminate([cluster.procs["agent-a"]], 10)  # it records its leaving: the log's last event

    async def caught_up() -> bool:
        head = await store.head()
        return (
            await store.checkpoint(RELAY_CHECKPOINT) >= head
            and await store.checkpoint(projections.NAME) >= head
        )

    await wait_until(caught_up, timeout=60, every=0.2, detail=detail)
    cluster.stop()
    head = await store.head()
    logged = len(await store.read_all(limit=1_000_000))
    assert await store.checkpoint(RELAY_CHECKPOINT) >= head, "nothing was logged after the agent"
    final = await stream_info(nats_cluster.url)
    assert final.state.messages == logged, "the bus holds every event once"
    assert await store.checkpoint(projections.NAME) >= head
    live = await snapshot(store)
    assert live["tr_trials"], "the tracker projected the search"
    await projections.rebuild(store)
    assert await snapshot(store) == live, "the tracker applied each event exactly once"
