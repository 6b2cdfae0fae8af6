"""Failover: a searcher leader is SIGKILLed; how long until its standby decides again.

A fresh database of the bench's PostgreSQL gets a log of ~100k events (200 finished random
searches of 5 trials, each trial a stream of allocations, workloads, validations, checkpoints and
its exit), written as the services would have (the searches' trials are the ones their method
chooses) with the searcher's checkpoint at the head. A relay and two searcher replicas run as
processes on it and a nats-server of its own. Each round:

1. waits until one replica leads and the other stands by;
2. SIGKILLs the leader and at once appends a new experiment (``ExperimentSubmitted``);
3. waits for the standby's ``TrialRequested`` for it.

Figures (PostgreSQL's clock throughout): kill -> standby elected (``LeaderElected``) and kill ->
standby decided (``TrialRequested``, which includes the election, folding the log's tail from
the standby's warm state and the first catch-up). The killed replica is restarted as the next
round's standby. Then the same with SIGSTOP instead of SIGKILL: the paused leader's session ends
after the lease timeout, the standby takes over, and the leader, continued, steps down and is the
next round's standby. Target: the decision within 2 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import BenchContext, Measure, Report, progress
from bench.event_store import INSERT_COLUMNS
from cairn.local.processes import ProcessCluster
from cairn.local.servers import ServerProcess, start_nats
from events.domain.config import parse_config
from events.domain.names import experiment_stream, trial_stream
from events.domain.search import Create, make_method
from events.domain.types import (
    CheckpointSaved,
    ExperimentStateChanged,
    ExperimentSubmitted,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.envelope import Event, RecordedEvent
from events.log.lease import lease_timeout
from events.log.store import EventStore, lease_stream

EXPERIMENTS = 200
TRIALS = 5
TRAINING_EVENTS = 92  # per trial; with its 6 other events a trial stream holds 98
ROUNDS = 3
PAUSES = 2
TARGET_S = 2.0
REPLICAS = ("searcher-a", "searcher-b")


def _config(max_trials: int) -> dict[str, Any]:
    return {
        "name": "failover-bench",
        "entrypoint": "python3 train.py",
        "hyperparameters": {
            "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
            "hidden": {"type": "int", "minval": 8, "maxval": 64},
        },
        "searcher": {
            "name": "random",
            "metric": "validation_loss",
            "max_trials": max_trials,
            "max_concurrent_trials": max_trials,
        },
        "reproducibility": {"experiment_seed": 7},
    }


def _history(exp: int) -> Iterator[tuple[str, Event, str]]:
    """(stream, event, actor) of one finished search, in the order the cluster wrote them."""
    config = _config(TRIALS)
    method = make_method(parse_config(config))
    creates = [op for op in method.initial_operations() if isinstance(op, Create)]
    exp_stream = experiment_stream(exp)
    yield exp_stream, ExperimentSubmitted(experiment_id=exp, config=config), "api"
    trials = []
    for seq, create in enumerate(creates, start=1):
        trial_id = exp * 10 + seq
        trials.append(trial_id)
        requested = TrialRequested(
            experiment_id=exp,
            trial_id=trial_id,
            seq=seq,
            request_id=create.request_id,
            hparams=create.hparams,
            trial_seed=create.trial_seed,
        )
        yield exp_stream, requested, "searcher"
    for trial_id in trials:
        stream = trial_stream(trial_id)
        alloc = f"alloc-{trial_id}-1"
        placements = {"agent-1": [f"slot-{trial_id % 4}"]}
        yield (
            stream,
            SlotsAllocated(trial_id=trial_id, allocation_id=alloc, placements=placements),
            "scheduler",
        )
        yield (
            stream,
            TrialStarted(trial_id=trial_id, allocation_id=alloc, run_id=1, agent_id="agent-1"),
            "agent",
        )
        for k in range(TRAINING_EVENTS):
            yield stream, _training(trial_id, k), "agent"
        yield (
            stream,
            TrialExited(trial_id=trial_id, run_id=1, allocation_id=alloc, outcome="completed"),
            "agent",
        )
        yield (
            stream,
            SlotsReleased(trial_id=trial_id, allocation_id=alloc, placements=placements),
            "scheduler",
        )
        yield stream, TrialStateChanged(trial_id=trial_id, state="COMPLETED"), "tracker"
    yield exp_stream, ExperimentStateChanged(experiment_id=exp, state="COMPLETED"), "searcher"


def _training(trial_id: int, k: int) -> Event:
    steps = 100 * (k + 1)
    loss = round(2.0 / (1 + k) + (trial_id % 7) / 100, 6)
    if k % 4 == 2:
        return ValidationReported(
            trial_id=trial_id, run_id=1, steps_completed=steps, metrics={"validation_loss": loss}
        )
    if k % 4 == 3:
        return CheckpointSaved(
            trial_id=trial_id,
            run_id=1,
            uuid=str(uuid.UUID(int=trial_id * 1000 + k)),
            steps_completed=steps,
            resources={"model.pt": 4_194_304},
        )
    return WorkloadCompleted(
        trial_id=trial_id, run_id=1, steps_completed=steps, metrics={"loss": loss}
    )


async def _load(dsn: str) -> int:
    """Writes the finished searches with COPY; moves the searcher's checkpoint to the head."""
    store = await EventStore.connect(dsn)  # applies the migrations
    await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        total = 0
        for first in range(1, EXPERIMENTS + 1, 20):
            versions: dict[str, int] = {}
            records = []
            for exp in range(first, min(first + 20, EXPERIMENTS + 1)):
                for stream, event, actor in _history(exp):
                    versions[stream] = versions.get(stream, 0) + 1
                    records.append(
                        (
                            uuid.uuid4(),
                            stream,
                            versions[stream],
                            event.event_type,
                            event.schema_version,
                            event.model_dump_json(),
                            f'{{"actor":"{actor}"}}',
                        )
                    )
            await conn.copy_records_to_table("events", columns=INSERT_COLUMNS, records=records)
            total += len(records)
        await conn.execute(
            """INSERT INTO checkpoints (name, position)
               SELECT name, (SELECT max(position) FROM events)
               FROM unnest(ARRAY['searcher', 'relay']) AS name"""
        )
        await conn.execute("SELECT setval('trial_ids', $1)", EXPERIMENTS * 10 + 10)
        await conn.execute("SELECT setval('experiment_ids', $1)", EXPERIMENTS + 10)
        await conn.execute("ANALYZE events")
        return total
    finally:
        await conn.close()


class Seconds(Measure):
    """A duration in seconds (lower is better), shown with two decimals."""

    decimals = 2


async def _wait(predicate: Any, timeout: float, what: str, cluster: ProcessCluster) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await predicate()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{what} not within {timeout:.0f}s\n{cluster.logs()}")


async def _leader(store: EventStore, cluster: ProcessCluster) -> str | None:
    """The replica that leads (holder of the latest election), once the other stands by."""
    latest = (await store.read_stream(lease_stream("searcher")))[-1:]
    if not latest:
        return None
    pid = int(str(latest[0].payload["holder"]).rsplit(":", 1)[1])
    by_pid = {proc.pid: name for name, proc in cluster.procs.items() if name in REPLICAS}
    leader = by_pid.get(pid)
    if leader is None or cluster.procs[leader].poll() is not None:
        return None
    other = next(n for n in REPLICAS if n != leader)
    log = (cluster.workdir / f"{other}.log").read_text(errors="replace")
    return leader if "standby" in log.rsplit("lease acquired", 1)[-1] else None


async def _round(
    store: EventStore, cluster: ProcessCluster, exp: int, *, pause: bool = False
) -> tuple[float, float]:
    """One SIGKILL (or, with ``pause``, SIGSTOP) of the leader; returns (seconds to election,
    seconds to decision) by PostgreSQL's clock."""
    leader = await _wait(lambda: _leader(store, cluster), 120, "a leader and a standby", cluster)
    head = await store.head()
    await _wait(lambda: _at_least(store, head), 120, "the leader caught up with the log", cluster)
    elections = len(await store.read_stream(lease_stream("searcher")))
    killed_at: datetime = await store.fetchval("SELECT clock_timestamp()")
    os.kill(cluster.procs[leader].pid, signal.SIGSTOP if pause else signal.SIGKILL)
    await store.append(
        experiment_stream(exp), [ExperimentSubmitted(experiment_id=exp, config=_config(1))]
    )

    async def decided() -> RecordedEvent | None:
        found = [
            e for e in await store.read_stream(experiment_stream(exp)) if e.type == "TrialRequested"
        ]
        return found[0] if found else None

    decision = await _wait(decided, 60, "the standby's decision", cluster)
    election = (await store.read_stream(lease_stream("searcher")))[elections]
    if pause:  # the ex-leader steps down and is the next round's standby
        log = cluster.workdir / f"{leader}.log"
        stepped = _count(log, "standing by")
        os.kill(cluster.procs[leader].pid, signal.SIGCONT)
        await _wait(
            lambda: _grew(log, "standing by", stepped), 60, "the ex-leader's step-down", cluster
        )
    else:
        cluster.procs[leader].wait(10)
        cluster.start(leader, "services.searcher")  # the next round's standby
    return (
        (election.recorded_at - killed_at).total_seconds(),
        (decision.recorded_at - killed_at).total_seconds(),
    )


async def _grew(path: Path, text: str, before: int) -> bool:
    return await asyncio.to_thread(_count, path, text) > before


def _count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text)


async def _at_least(store: EventStore, position: int) -> bool:
    return await store.checkpoint("searcher") >= position


async def run(ctx: BenchContext) -> Report:
    """Loads the log, runs the kill rounds, reports the median and worst figures."""
    report = Report()
    dsn = await ctx.create_database("bench_failover")
    progress(f"failover: loading {EXPERIMENTS} finished searches")
    total = await _load(dsn)
    progress(f"failover: {total:,} events loaded; starting a relay and two searchers")
    nats: ServerProcess = await asyncio.to_thread(start_nats, ctx.tmp / "nats-failover")
    workdir = ctx.tmp / "failover"
    workdir.mkdir(exist_ok=True)
    cluster = ProcessCluster(dsn, nats.url, workdir)
    store = await EventStore.connect(dsn)
    elected: list[float] = []
    decided: list[float] = []
    paused: list[float] = []
    try:
        cluster.start("relay", "services.relay")
        cluster.start(REPLICAS[0], "services.searcher")
        await _wait(lambda: _leader_started(store), 120, "the first election", cluster)
        cluster.start(REPLICAS[1], "services.searcher")
        for n in range(ROUNDS):
            election_s, decision_s = await _round(store, cluster, EXPERIMENTS + 1 + n)
            progress(f"  round {n + 1}: elected {election_s:.2f}s, decided {decision_s:.2f}s")
            elected.append(election_s)
            decided.append(decision_s)
        for n in range(PAUSES):
            exp = EXPERIMENTS + 1 + ROUNDS + n
            election_s, decision_s = await _round(store, cluster, exp, pause=True)
            progress(f"  pause {n + 1}: elected {election_s:.2f}s, decided {decision_s:.2f}s")
            paused.append(decision_s)
    finally:
        await store.close()
        await asyncio.to_thread(cluster.stop)
        nats.stop()
    report.measures.append(
        Seconds(
            name="leader SIGKILL -> standby decided (median)",
            cairn=statistics.median(decided),
            baseline=TARGET_S,
            baseline_label="target",
            unit="s",
            count=total,
            notes="seconds; ratio < 1 is under the target",
        )
    )
    report.measures.append(
        Seconds(
            name="leader SIGSTOP -> standby decided (median)",
            cairn=statistics.median(paused),
            baseline=TARGET_S,
            baseline_label="target",
            unit="s",
            count=total,
            notes=f"seconds; includes the lease timeout ({lease_timeout():.1f}s)",
        )
    )
    report.details.update(
        events=total,
        rounds=ROUNDS,
        elected_s=elected,
        decided_s=decided,
        decided_max_s=max(decided),
        paused_decided_s=paused,
        lease_timeout_s=lease_timeout(),
        target_s=TARGET_S,
    )
    report.notes.append(
        f"log of {total:,} events; kill -> elected {statistics.median(elected):.2f}s median, "
        f"kill -> decided {statistics.median(decided):.2f}s median, {max(decided):.2f}s worst "
        f"(target {TARGET_S:.0f}s)"
    )
    return report


async def _leader_started(store: EventStore) -> bool:
    return bool(await store.read_stream(lease_stream("searcher")))
