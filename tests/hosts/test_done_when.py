"""The many-hosts issue's "done when": a search across hosts through a cut link, a killed NATS
server and a lossy link, checked against a fault-free run and watched through ``/metrics``.

What "matches a fault-free run" means here: the searcher asks for the same 16 trials (the same
hyperparameters in the same order: they come from the experiment's seed), every validation
metric reported for a trial at a step equals the fault-free run's for that trial and step (the
scripted trial's metrics are a function of its hyperparameters and step), the best metric of the
search is the same, and the 4-rank trial's every validation loss equals the one-process run's
(:mod:`tests.e2e.ddp_reference`). Which trials ASHA stops early may differ: it decides on the
results it has when it decides, and the faults move their arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import nats
import nats.errors
import pytest

from cairn.local.servers import NatsCluster
from events.domain import names
from events.domain.check import check_log
from events.log.bus import EVENTS_STREAM, connect_options
from events.log.store import EventStore
from tests.e2e.harness import experiment_state, first_trial, rank_pid, trial_ids, wait_for
from tests.e2e.observed import parse
from tests.helpers import wait_until
from tests.hosts.conftest import AGENT_HOSTS, CONTROL, SPARE_HOST, HostCluster
from tests.hosts.netns import Network
from tests.hosts.test_distributed import four_ranks, reference_of
from tests.hosts.trials import DIGITS, SCRIPTED, explained, placements, scripted

AGENTS = (*AGENT_HOSTS, SPARE_HOST)
"""Three 2-slot agent hosts: the 4-rank trial takes two whole hosts, the search the third."""
AGENT_TIMEOUT = 4.0
"""The scheduler's agent timeout here, in seconds."""
TRIALS = 16
GANG_BATCHES = 1000
"""Long enough for the 4-rank trial to train through the faults (400 was not, now and then)."""
GANG_VALIDATE_EVERY = 100


def asha(checkpoints: Path) -> dict[str, Any]:
    """Sixteen scripted trials under adaptive ASHA, each trial's validation loss raised by its
    own ``validation_offset`` (so trials rank the same at every step)."""
    config = scripted(checkpoints, steps=32, report_every=4, checkpoint_every=8, sleep=0.25)
    config["hyperparameters"]["validation_offset"] = {
        "type": "double",
        "minval": 0.0,
        "maxval": 1.0,
    }
    config["searcher"] = {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "time_metric": "batches",
        "max_time": 32,
        "max_trials": TRIALS,
        "max_concurrent_trials": 4,
        "divisor": 4,
    }
    return config


@dataclass
class SearchResult:
    """What a search decided and measured."""

    hparams: list[dict[str, Any]]
    """Each trial's hyperparameters, in the order the searcher asked for them."""
    metrics: dict[tuple[int, int], float] = field(default_factory=dict)
    """``{(trial seq, steps): validation_loss}``."""

    @property
    def best(self) -> float:
        """The search's best (lowest) validation loss."""
        return min(self.metrics.values())


async def search_result(store: EventStore, experiment_id: int) -> SearchResult:
    """The hyperparameters the searcher asked for and the validation losses reported."""
    requested = [
        e.payload
        for e in await store.read_stream(names.experiment_stream(experiment_id))
        if e.type == "TrialRequested"
    ]
    seq = {r["trial_id"]: r["seq"] for r in requested}
    result = SearchResult([r["hparams"] for r in sorted(requested, key=lambda r: r["seq"])])
    for e in await store.read_all(types=["ValidationReported"], limit=1_000_000):
        if e.payload["trial_id"] in seq:
            key = (seq[e.payload["trial_id"]], e.payload["steps_completed"])
            result.metrics[key] = e.payload["metrics"]["validation_loss"]
    return result


async def stream_leader(url: str) -> str | None:
    """The cluster member leading the events stream (``None`` while one is elected)."""
    with contextlib.suppress(nats.errors.Error, OSError):
        nc = await nats.connect(**connect_options(url), connect_timeout=5, max_reconnect_attempts=2)
        try:
            info = await nc.jetstream(timeout=5).stream_info(EVENTS_STREAM)
        finally:
            await nc.close()
        return str(info.cluster.leader) if info.cluster and info.cluster.leader else None
    return None


@dataclass
class Watched:
    """The most the API's ``/metrics`` showed while watched."""

    lost_agents: float = 0.0
    heartbeat_age: dict[str, float] = field(default_factory=dict)
    lag: dict[str, float] = field(default_factory=dict)
    scrapes: int = 0


async def watch_metrics(cluster: HostCluster, seen: Watched) -> None:
    """Scrapes the API's ``/metrics`` (with the admin's token) until cancelled, keeping the
    highest lost-agent count, heartbeat age per agent and lag per consumer."""
    headers = {"Authorization": f"Bearer {cluster.token}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while True:
            try:
                async with http.get(f"{cluster.api_url}/metrics", headers=headers) as resp:
                    text = await resp.text() if resp.status == 200 else ""
            except (aiohttp.ClientError, TimeoutError):
                text = ""
            if text:
                seen.scrapes += 1
                for s in parse(text).samples:
                    if s.name == "cairn_agents" and s.labels.get("state") == "lost":
                        seen.lost_agents = max(seen.lost_agents, s.value)
                    elif s.name == "cairn_agent_heartbeat_age_seconds":
                        agent = s.labels["agent"]
                        seen.heartbeat_age[agent] = max(seen.heartbeat_age.get(agent, 0), s.value)
                    elif s.name == "cairn_consumer_lag_events":
                        consumer = s.labels["consumer"]
                        seen.lag[consumer] = max(seen.lag.get(consumer, 0), s.value)
            await asyncio.sleep(0.2)  # the scrape interval, not a wait on a condition


@pytest.mark.timeout(600)
async def test_asha_search_and_a_four_rank_trial_survive_a_cut_link_a_killed_nats_server_and_loss(
    network: Network,
    db_url: str,
    nats_cluster: NatsCluster,
    store: EventStore,
    tmp_path: Path,
) -> None:
    """On the bed (control host: PostgreSQL, a three-server NATS cluster, the services; three
    2-slot agent hosts), a fault-free 16-trial ASHA search runs first; then a 4-rank trial
    across two agent hosts and the same search run together while, in turn, the search's host
    is cut off (and lost) and restored, the events stream's leader is SIGKILLed, and 5% of a
    rank host's packets are dropped: both complete, ``events.check`` is clean, the search
    matches the fault-free one, the gang's losses equal the one-process run's, and ``/metrics``
    showed the lost agent and a consumer lag during the faults."""
    control = network.hosts[CONTROL]
    cluster = HostCluster(
        db_url, nats_cluster.url, tmp_path, api_host=control.address, network=network
    )
    watcher: asyncio.Task[None] | None = None
    try:
        cluster.start_services("--agent-timeout", str(AGENT_TIMEOUT), timeout=60)
        cluster.start("tracker", "services.tracker", "--checkpoint-root", str(tmp_path / "tr"))
        cluster.start_agents(2, "--rendezvous-timeout", "120", ids=AGENTS)
        await cluster.login()

        async def completed(exp: int) -> bool:
            return await experiment_state(store, exp) == "COMPLETED"

        clean = await cluster.submit(asha(tmp_path / "ckpt-clean"), SCRIPTED)
        await wait_for(cluster, lambda: completed(clean), timeout=120)
        expected = await search_result(store, clean)
        assert len(expected.hparams) == TRIALS

        seen = Watched()
        watcher = asyncio.create_task(watch_metrics(cluster, seen))
        gang_config = four_ranks(tmp_path, GANG_BATCHES)
        gang_config["hyperparameters"]["validate_every"] = GANG_VALIDATE_EVERY
        gang_exp = await cluster.submit(gang_config, DIGITS)
        gang = await first_trial(cluster, store, gang_exp)
        reference = asyncio.create_task(reference_of(store, gang_exp))
        allocation = names.allocation_id(gang, 1)

        def ranks_running() -> bool:
            return all(rank_pid(allocation, rank) is not None for rank in range(4))

        await wait_until(ranks_running, timeout=180, every=0.1, detail=cluster.logs)
        [gang_hosts] = await placements(store, gang)
        assert len(gang_hosts) == 2, gang_hosts
        [search_host] = [a for a in AGENTS if a not in gang_hosts]
        search = await cluster.submit(asha(tmp_path / "ckpt"), SCRIPTED)

        async def search_placed() -> bool:
            for trial in await trial_ids(store, search):
                if [search_host] in await placements(store, trial):
                    return True
            return False

        await wait_for(cluster, search_placed, timeout=60)

        # Fault 1: the search's host is cut off until its agent is lost, then restored.
        network.cut(search_host)

        async def lost() -> bool:
            stream = await store.read_stream(names.agent_stream(search_host))
            return "AgentLost" in [e.type for e in stream]

        await wait_for(cluster, lost, timeout=60)

        def shown_lost() -> bool:
            age = seen.heartbeat_age.get(search_host, 0)
            return seen.lost_agents >= 1 and age > AGENT_TIMEOUT

        await wait_until(shown_lost, timeout=30, every=0.1, detail=lambda: str(seen))
        network.restore(search_host)

        # Fault 2: the events stream's leader is SIGKILLed; another member takes over.
        leader_name = await wait_until(
            lambda: stream_leader(nats_cluster.url), timeout=30, every=0.2
        )
        leader = nats_cluster.member(leader_name)
        head_at_kill = await store.head()
        leader.kill()
        assert leader.proc.returncode == -signal.SIGKILL

        async def moved() -> bool:
            now = await stream_leader(nats_cluster.url)
            return now not in (None, leader_name) and await store.head() > head_at_kill

        await wait_for(cluster, moved, timeout=60)

        # Fault 3: 5% of a rank host's packets dropped at random, to the end.
        lossy = gang_hosts[0]
        network.drop_at_random(lossy, 0.05)
        assert not await completed(gang_exp), "the faults landed while the 4-rank trial ran"

        await explained(wait_for(cluster, lambda: completed(gang_exp), timeout=300), store, gang)
        await wait_for(cluster, lambda: completed(search), timeout=240)
        assert network.dropped(lossy) > 0, "no packet was dropped"
        watcher.cancel()

        got = await search_result(store, search)
        assert got.hparams == expected.hparams
        shared = got.metrics.keys() & expected.metrics.keys()
        assert shared and all(got.metrics[k] == expected.metrics[k] for k in shared)
        assert got.best == expected.best
        losses = {
            e.payload["steps_completed"]: e.payload["metrics"]["validation_loss"]
            for e in await store.read_stream(names.trial_stream(gang))
            if e.type == "ValidationReported"
        }
        want = await reference
        assert GANG_BATCHES in losses
        for steps, loss in losses.items():
            assert loss == pytest.approx(want[steps], rel=1e-4), steps
        assert seen.lost_agents >= 1, seen
        assert seen.heartbeat_age.get(search_host, 0) > AGENT_TIMEOUT, seen
        assert any(lag > 0 for lag in seen.lag.values()), seen
        assert await check_log(store) == []
        print(
            f"search host {search_host} cut and lost, {leader_name} killed, {lossy} lossy "
            f"({network.dropped(lossy)} packets dropped); /metrics over {seen.scrapes} scrapes: "
            f"lost agents {seen.lost_agents}, heartbeat age {seen.heartbeat_age}, lag {seen.lag}"
        )
    finally:
        if watcher is not None:
            watcher.cancel()
        cluster.stop()
