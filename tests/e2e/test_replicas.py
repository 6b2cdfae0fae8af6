"""``cairn up --replicas 2``: a standby of each decider takes over from a killed or paused leader.

One embedded cluster of real processes; the leaders are found from the log (the holder of each
lease's latest ``LeaderElected``), then SIGKILLed or SIGSTOPped. Every decision the standby makes
carries its new epoch, and the log's invariants hold afterwards.
"""

from __future__ import annotations

import copy
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from cairn.local.topology import DECIDERS, SERVICES
from events.domain.check import check_log
from events.domain.names import experiment_stream, trial_stream
from events.log.envelope import RecordedEvent
from events.log.store import EventStore, lease_stream
from tests.e2e.harness import Cluster
from tests.e2e.test_embedded_cluster import cairn, down, processes, status
from tests.helpers import ROOT, wait_until

SCRIPTED = ROOT / "examples" / "scripted"

# A whole replicated cluster costs ~30 s on two cores, more than `make test` can spare: it runs in
# `make failover`, which sets this variable.
pytestmark = pytest.mark.skipif(
    os.environ.get("CAIRN_REPLICA_TESTS") != "1",
    reason="a replicated cluster: run with `make failover` (CAIRN_REPLICA_TESTS=1)",
)
SEARCHER_DECISIONS = ("TrialRequested", "TrialStopRequested")


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Path]:
    """An embedded cluster with two replicas of each decider and two CPU slots."""
    data_dir = tmp_path / "cairn"
    data_dir.mkdir()
    (data_dir / "cluster.yaml").write_text(f"checkpoint_storage: {{allowed_roots: [{tmp_path}]}}\n")
    done = cairn(
        "up", "--data-dir", str(data_dir), "--slots", "2", "--api-port", "0",
        "--stop-timeout", "3", "--replicas", "2",
    )  # fmt: skip
    assert done.returncode == 0, f"cairn up failed:\n{done.stdout}\n{done.stderr}"
    try:
        yield data_dir
    finally:
        down(data_dir)


def config(checkpoints: Path) -> dict[str, Any]:
    """A single short scripted trial."""
    loaded = copy.deepcopy(yaml.safe_load((SCRIPTED / "config.yaml").read_text()))
    loaded["hyperparameters"].update(steps=20, sleep=0.01, checkpoint_every=0)
    loaded["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(checkpoints)}
    return loaded


async def elections(store: EventStore, lease: str) -> list[RecordedEvent]:
    """The lease's ``LeaderElected`` events, oldest first."""
    return await store.read_stream(lease_stream(lease))


def holder_pid(event: RecordedEvent) -> int:
    """The pid of the process a ``LeaderElected`` elected."""
    return int(str(event.payload["holder"]).rsplit(":", 1)[1])


async def leader_pid(store: EventStore, lease: str, replicas: dict[str, int]) -> int:
    """The pid of the replica that leads ``lease`` (waits for one of ``replicas`` to lead)."""

    async def leading() -> int | None:
        latest = (await elections(store, lease))[-1:]
        pid = holder_pid(latest[0]) if latest else None
        return pid if pid in replicas.values() else None

    return int(await wait_until(leading, timeout=60, every=0.1))


async def decisions(store: EventStore, stream: str, kind: str) -> list[RecordedEvent]:
    return [e for e in await store.read_stream(stream) if e.type == kind]


def logs(data_dir: Path) -> str:
    return "\n".join(
        f"== {p.name}\n{p.read_text(errors='replace')[-2500:]}"
        for p in sorted((data_dir / "logs").glob("*.log"))
    )


async def test_standbys_take_over_from_killed_and_paused_leaders(
    replicated: Path, tmp_path: Path
) -> None:
    """SIGKILL of the scheduler leader: the standby is elected and schedules the next trial under
    its new epoch; SIGSTOP of the searcher leader: the standby is elected while it is paused and
    decides; after SIGCONT the ex-leader steps down (alive, no write of its epoch after the
    election) and the log's invariants hold."""
    code, report = status(replicated)
    assert code == 0, report
    procs = processes(report)
    replica_names = {f"{d}-2" for d in DECIDERS}
    assert set(procs) == {"postgres", "nats", *SERVICES, *replica_names}
    state = json.loads((replicated / "cluster.json").read_text())
    store = await EventStore.connect(state["dsn"])
    cluster = Cluster(
        state["dsn"],
        state["nats_url"],
        tmp_path,
        api_port=state["ports"]["api"],
        admin_password=(replicated / "admin.password").read_text().strip(),
    )
    try:
        await cluster.login()

        # SIGKILL the scheduler leader; the standby schedules the next trial.
        schedulers = {n: int(procs[n]["pid"]) for n in ("scheduler", "scheduler-2")}
        killed = await leader_pid(store, "scheduler", schedulers)
        before = len(await elections(store, "scheduler"))
        os.kill(killed, signal.SIGKILL)
        survivor = next(pid for pid in schedulers.values() if pid != killed)
        new = await leader_pid(store, "scheduler", {"standby": survivor})
        assert new == survivor
        election = (await elections(store, "scheduler"))[-1]
        assert election.stream_version > before
        exp = await cluster.submit(config(tmp_path / "ckpt"), SCRIPTED)

        async def scheduled() -> list[RecordedEvent]:
            requested = await decisions(store, experiment_stream(exp), "TrialRequested")
            if not requested:
                return []
            trial = int(requested[0].payload["trial_id"])
            return await decisions(store, trial_stream(trial), "SlotsAllocated")

        allocated = await wait_until(
            scheduled, timeout=60, every=0.2, detail=lambda: logs(replicated)
        )
        assert allocated[0].metadata.epoch == election.stream_version

        # SIGSTOP the searcher leader; the standby takes over while it is paused.
        code, report = status(replicated)
        procs = processes(report)
        searchers = {n: int(procs[n]["pid"]) for n in ("searcher", "searcher-2")}
        paused = await leader_pid(store, "searcher", searchers)
        standby = next(pid for pid in searchers.values() if pid != paused)
        os.kill(paused, signal.SIGSTOP)
        try:
            await wait_until(lambda: psutil.Process(paused).status() == psutil.STATUS_STOPPED)
            await leader_pid(store, "searcher", {"standby": standby})
            taken = (await elections(store, "searcher"))[-1]
            assert psutil.Process(paused).status() == psutil.STATUS_STOPPED
            second = await cluster.submit(config(tmp_path / "ckpt"), SCRIPTED)
            requested = await wait_until(
                lambda: decisions(store, experiment_stream(second), "TrialRequested"),
                timeout=60,
                every=0.2,
                detail=lambda: logs(replicated),
            )
            assert requested[0].metadata.epoch == taken.stream_version
        finally:
            os.kill(paused, signal.SIGCONT)
        name = next(n for n, pid in searchers.items() if pid == paused)
        log_path = replicated / "logs" / f"{name}.log"
        await wait_until(
            lambda: "standing by" in log_path.read_text(errors="replace"),
            timeout=30,
            detail=lambda: log_path.read_text(errors="replace")[-3000:],
        )
        assert psutil.Process(paused).is_running(), "the ex-leader stepped down, not out"
        late = [
            e
            for e in await store.read_all(taken.position, limit=100_000, types=SEARCHER_DECISIONS)
            if e.metadata.epoch != taken.stream_version
        ]
        assert late == [], "the paused ex-leader wrote nothing after the election"
        assert await check_log(store) == []
    finally:
        await store.close()
