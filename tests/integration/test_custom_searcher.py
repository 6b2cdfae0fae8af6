"""Custom searchers over a real log: the user's class runs from the experiment's code, its
decisions replay exactly, and a hostile one fails its own experiment, not the service."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from events.check import check_log
from events.consumer import ConsumerRunner
from events.names import trial_stream
from events.store import EventStore
from events.types import ExperimentSubmitted, TrialStateChanged, ValidationReported
from services.api import tables
from services.searcher.custom_worker import CustomWorkers
from services.searcher.sandbox import SandboxSettings
from services.searcher.service import SearcherConsumer
from tests.helpers import wait_until
from tests.integration.test_searcher_service import CONFIG, _fresh_store

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"

HOSTILE = """
from cairn.searcher import SearchMethod

class Raises(SearchMethod):
    def initial_operations(self):
        return [self.context.create()]
    def on_trial_exited(self, request_id, reason):
        raise RuntimeError("boom in on_trial_exited")

class Spins(SearchMethod):
    def initial_operations(self):
        while True:
            pass

class Greedy(SearchMethod):
    def initial_operations(self):
        return [self.context.create() for _ in range(self.context.max_trials + 1)]

class Garbage(SearchMethod):
    def initial_operations(self):
        return ["not an operation"]

class HalfLine(SearchMethod):
    def initial_operations(self):
        import sys, time
        sys.__stdout__.write('{"ops": [')
        sys.__stdout__.flush()
        time.sleep(3600)
"""


def tarball(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def submit(store: EventStore, exp_id: int, searcher: dict[str, Any], code: bytes) -> None:
    """Stores the code as the gateway does and appends the experiment."""
    await tables.migrate(store)
    code_ref = f"sha256:{hashlib.sha256(code).hexdigest()}"
    await store.pool.execute(
        "INSERT INTO code_blobs (code_ref, data, size) VALUES ($1, $2, $3) "
        "ON CONFLICT (code_ref) DO NOTHING",
        code_ref,
        code,
        len(code),
    )
    config = {**CONFIG, "searcher": {"metric": "validation_loss", **searcher}}
    event = ExperimentSubmitted(experiment_id=exp_id, config=config, code_ref=code_ref)
    await store.append(f"experiment-{exp_id}", [event])


class Searcher:
    """A searcher consumer with its custom searcher workers, as a leader runs them (no lease)."""

    def __init__(self, store: EventStore, settings: SandboxSettings) -> None:
        self.store = store
        self.consumer = SearcherConsumer(store)
        self.workers = CustomWorkers(store, fence=None, settings=settings)
        self.consumer.workers = self.workers
        self.runner = ConsumerRunner(store, None, self.consumer)

    async def rebuild(self) -> None:
        """Folds the log, as a restarted searcher does before it leads."""
        await self.consumer.rebuild()

    async def settle(self, timeout: float = 60.0) -> None:
        """Catches up until no custom searcher owes an answer (each answer is a fact the
        workers append, which the next catch-up folds)."""

        async def settled() -> bool:
            await self.runner.catch_up()
            return not any(s.answers_due for s in self.consumer.custom.values())

        await wait_until(settled, timeout=timeout, every=0.05)

    async def close(self) -> None:
        """Stops the workers and their processes."""
        await self.workers.close()


async def drive(
    store: EventStore,
    restart_at: frozenset[int] = frozenset(),
    settings: SandboxSettings | None = None,
) -> list[Any]:
    """Each round every open trial reports one validation (loss from its hparams) and
    completes; returns the searcher's decisions once every experiment stopped."""
    settings = settings or SandboxSettings()
    searcher = Searcher(store, settings)
    try:
        for round_no in range(100):
            if round_no in restart_at:
                await searcher.close()  # the old processes die with their searcher
                searcher = Searcher(store, settings)  # a fresh process: it knows only the log
                await searcher.rebuild()
            await searcher.settle()
            events = await store.read_all(limit=100_000)
            experiments = {
                e.payload["experiment_id"] for e in events if e.type == "ExperimentSubmitted"
            }
            stopping = {
                e.payload["experiment_id"] for e in events if e.type == "ExperimentStateChanged"
            }
            if experiments <= stopping:
                break
            closed = {e.payload["trial_id"] for e in events if e.type == "TrialStateChanged"}
            for e in events:
                if e.type != "TrialRequested" or e.payload["trial_id"] in closed:
                    continue
                tid, hp = e.payload["trial_id"], e.payload["hparams"]
                loss = abs(hp["lr"] - 0.01) + hp["hidden"] / 1000
                await store.append(
                    trial_stream(tid),
                    [
                        ValidationReported(
                            trial_id=tid,
                            run_id=1,
                            steps_completed=10,
                            metrics={"validation_loss": loss},
                        ),
                        TrialStateChanged(trial_id=tid, state="COMPLETED"),
                    ],
                )
        else:
            raise AssertionError("the searches did not end")
    finally:
        await searcher.close()
    return [
        (e.type, e.payload.get("experiment_id"), e.payload.get("hparams"), e.payload.get("state"))
        for e in await store.read_all(limit=100_000)
        if e.type in ("TrialRequested", "TrialStopRequested", "ExperimentStateChanged")
    ]


GREEDY = {
    "name": "custom",
    "searcher_class": "greedy_search:GreedySearch",
    "searcher_args": {"startup": 3, "spread": 0.3},
    "max_trials": 8,
    "max_concurrent_trials": 3,
}


@pytest.mark.skipif(
    not os.environ.get("CAIRN_SEARCH_E2E"),
    reason="two searches with searcher processes (~10 s): make test-search",
)
async def test_example_custom_searcher_runs_and_replays_exactly(
    db_url: str, pg_server: Any
) -> None:
    """The digits example's greedy searcher, loaded from the experiment's code, requests its
    8 trials and completes; restarted searchers (replaying the log into a fresh process) decide
    exactly what an unbroken one does."""
    code = tarball({"greedy_search.py": (DIGITS / "greedy_search.py").read_text()})
    results = []
    for restarts in (frozenset(), frozenset({2})):
        store = await _fresh_store(pg_server, f"cs_{len(results)}_{abs(hash(db_url)) % 10_000}")
        await submit(store, 1, GREEDY, code)
        results.append(await drive(store, restarts))
        assert await check_log(store) == []
        await store.close()
    straight, restarted = results
    assert restarted == straight
    requested = [d for d in straight if d[0] == "TrialRequested"]
    assert len(requested) == 8
    assert straight[-1] == ("ExperimentStateChanged", 1, None, "STOPPING_COMPLETED")


HOSTILE_CASES = {
    "Raises": "boom in on_trial_exited",
    "Spins": "took more than 1 s",
    "Greedy": "more than max_trials (2)",
    "Garbage": "must be cairn.searcher.Create or Stop",
    "HalfLine": "took more than 1 s",
}


async def test_hostile_custom_searchers_fail_their_experiments_only(store: EventStore) -> None:
    """Custom searchers that raise, never answer, create past max_trials or answer garbage
    each end their own experiment in STOPPING_ERROR with the reason; an experiment beside
    them in the same searcher runs to completion."""
    code = tarball({"hostile.py": HOSTILE})
    for exp_id, cls in enumerate(HOSTILE_CASES, start=1):
        searcher = {"name": "custom", "searcher_class": f"hostile:{cls}", "max_trials": 2}
        await submit(store, exp_id, searcher, code)
    random = {"name": "random", "max_trials": 2, "max_concurrent_trials": 2}
    other = {**CONFIG, "searcher": {"metric": "validation_loss", **random}}
    await store.append("experiment-9", [ExperimentSubmitted(experiment_id=9, config=other)])
    decisions = await drive(store, settings=SandboxSettings(call_timeout=1.0))
    ends = {d[1]: d[3] for d in decisions if d[0] == "ExperimentStateChanged"}
    assert ends == {**dict.fromkeys(range(1, 6), "STOPPING_ERROR"), 9: "STOPPING_COMPLETED"}
    for exp_id, reason in enumerate(HOSTILE_CASES.values(), start=1):
        (failed,) = [
            e
            for e in await store.read_stream(f"experiment-{exp_id}")
            if e.type == "ExperimentStateChanged"
        ]
        assert reason in failed.payload["reason"], failed.payload["reason"]
    assert len([d for d in decisions if d[0] == "TrialRequested" and d[1] == 9]) == 2
