"""Re-records a golden history from a real run: ``python -m tests.golden.record NAME``.

Starts PostgreSQL, nats-server and every service as processes (as the end-to-end tests do), runs
the named scenario on the scripted example, waits until the log is quiet, then writes the
normalised log and the state today's folds give it (replayed into a fresh database, exactly as
the test does) to ``tests/fixtures/golden/``. Read that directory's README before re-recording.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cairn.local.servers import start_nats, start_postgres
from events.log.store import EventStore
from tests.e2e.harness import Cluster, events_of, experiment_state, trial_ids
from tests.e2e.test_decisions import asha
from tests.e2e.test_trials import SCRIPTED, scripted
from tests.golden import history
from tests.helpers import create_database, wait_until

Scenario = Callable[[Cluster, EventStore, Path], Awaitable[None]]


async def _ended(cluster: Cluster, store: EventStore, exp: int, state: str, timeout: float) -> None:
    async def reached() -> bool:
        return await experiment_state(store, exp) == state

    await wait_until(reached, timeout, every=0.2, detail=cluster.logs)


async def _has(cluster: Cluster, store: EventStore, kind: str, count: int = 1) -> None:
    async def seen() -> bool:
        return len(await events_of(store, kind)) >= count

    await wait_until(seen, 60, every=0.2, detail=cluster.logs)


async def run_asha(cluster: Cluster, store: EventStore, tmp: Path) -> None:
    """Sixteen scripted trials under adaptive ASHA, four at a time, to COMPLETED."""
    exp = await cluster.submit(asha(tmp / "ckpt"), SCRIPTED)
    await _ended(cluster, store, exp, "COMPLETED", 150)


async def run_crash_resume(cluster: Cluster, store: EventStore, tmp: Path) -> None:
    """A trial crashes at step 45 (exit 3), restarts from its step-40 checkpoint and completes."""
    config = scripted(tmp / "ckpt", steps=60, sleep=0.01, checkpoint_every=20, fail_at_step=45)
    exp = await cluster.submit(config, SCRIPTED)
    await _ended(cluster, store, exp, "COMPLETED", 90)


async def run_preemption(cluster: Cluster, store: EventStore, tmp: Path) -> None:
    """Two priority-50 trials fill both slots; a priority-1 experiment preempts one, completes,
    and the preempted trial resumes; then the low-priority experiment completes too."""
    low = scripted(tmp / "ckpt", steps=120, sleep=0.05, checkpoint_every=1000)
    low["searcher"] = {"name": "grid", "metric": "validation_loss", "max_concurrent_trials": 2}
    low["hyperparameters"]["report_every"] = {"type": "categorical", "vals": [5, 10]}
    low["resources"]["priority"] = 50
    low_id = await cluster.submit(low, SCRIPTED)
    await _has(cluster, store, "TrialStarted", 2)
    high = scripted(tmp / "ckpt", steps=20, sleep=0.01)
    high["resources"]["priority"] = 1
    high_id = await cluster.submit(high, SCRIPTED)
    await _ended(cluster, store, high_id, "COMPLETED", 90)
    preempted = [e.payload["trial_id"] for e in await events_of(store, "PreemptionRequested")]
    if len(preempted) != 1 or preempted[0] not in await trial_ids(store, low_id):
        raise SystemExit(f"expected one preemption of a low-priority trial, got {preempted}")
    await _ended(cluster, store, low_id, "COMPLETED", 120)


async def run_kill(cluster: Cluster, store: EventStore, tmp: Path) -> None:
    """A user kills a running experiment after its trial reported: CANCELED, run killed."""
    exp = await cluster.submit(scripted(tmp / "ckpt", steps=10_000, sleep=0.05), SCRIPTED)
    await _has(cluster, store, "WorkloadCompleted")
    await cluster.action(exp, "kill")
    await _ended(cluster, store, exp, "CANCELED", 60)


SCENARIOS: dict[str, tuple[Scenario, int]] = {
    "asha": (run_asha, 4),
    "crash_resume": (run_crash_resume, 2),
    "preemption": (run_preemption, 2),
    "kill": (run_kill, 2),
}


async def _quiet(store: EventStore, polls: int = 10, every: float = 0.3) -> None:
    """Returns once the log's head has not moved for ``polls`` polls in a row."""
    head, same = await store.head(), 0
    while same < polls:
        await asyncio.sleep(every)
        now = await store.head()
        same = same + 1 if now == head else 0
        head = now


async def record(
    name: str, tmp: Path, run_dsn: str, replay_dsn: str, nats_url: str
) -> dict[str, Any]:
    """Runs scenario ``name`` on a fresh cluster and writes its history; returns its state."""
    scenario, slots = SCENARIOS[name]
    store = await EventStore.connect(run_dsn)
    cluster = Cluster(run_dsn, nats_url, tmp)
    cluster.start_all(slots=slots)
    try:
        await cluster.login()
        await scenario(cluster, store, tmp)
        await _quiet(store)
    finally:
        cluster.stop()
    events = await store.read_all(limit=1_000_000)
    await store.close()
    replace = {str(tmp): "/golden", cluster.api_url: "http://127.0.0.1:8080"}
    rows = history.normalise(events, replace)
    replay = await EventStore.connect(replay_dsn)
    try:
        await history.insert(replay, rows)
        state = await history.final_state(replay)
    finally:
        await replay.close()
    if state["check_log"]:
        raise SystemExit(f"{name}: the log breaks invariants: {state['check_log']}")
    derived = [d for d in state["searcher"]["decisions"] if "fact" not in d]
    if derived != history.logged_decisions(history.decoded(rows)):
        raise SystemExit(f"{name}: the searcher's replay does not decide what the log records")
    history.save(name, rows, state)
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(SCENARIOS), metavar="NAME")
    args = parser.parse_args()
    for name in args.names:
        tmp = Path(tempfile.mkdtemp(prefix=f"cairn-golden-{name}-"))
        pg = start_postgres(tmp / "pg", fast=True)
        nats = start_nats(tmp / "nats")
        try:
            dsns = create_database(pg), create_database(pg)
            state = asyncio.run(record(name, tmp, *dsns, nats.url))
        finally:
            nats.stop()
            pg.stop()
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"{name}: {state['events']} events -> {history.log_path(name)}")


if __name__ == "__main__":
    main()
