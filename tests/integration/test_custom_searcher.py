"""Custom searchers over a real log: the user's class runs from the experiment's code, its
decisions replay exactly, and a hostile one fails its own experiment, not the service."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from events.domain.check import check_log
from events.domain.names import trial_stream
from events.domain.types import (
    ExperimentStateChanged,
    ExperimentSubmitted,
    LeaderElected,
    TrialStateChanged,
    ValidationReported,
)
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore, Fence, lease_stream
from services.api import tables
from services.confine import default_identity
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
    await store.execute(
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

    def __init__(
        self, store: EventStore, settings: SandboxSettings, fence: Fence | None = None
    ) -> None:
        self.store = store
        self.consumer = SearcherConsumer(store)
        self.workers = CustomWorkers(store, fence=fence, settings=settings)
        self.consumer.workers = self.workers
        self.runner = ConsumerRunner(store, None, self.consumer, fence=fence)

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


COUNTED = """
import os, time
from cairn.searcher import SearchMethod

class Counted(SearchMethod):
    \"\"\"Writes a line to LOG/constructed each time it is built; creates one trial at first
    (once GATE exists, when given), nothing later.\"\"\"

    def __init__(self, context, log, tag, gate=None):
        super().__init__(context)
        with open(os.path.join(log, "constructed"), "a") as out:
            out.write(tag + "\\n")
        self.gate = gate

    def initial_operations(self):
        while self.gate and not os.path.exists(self.gate):
            time.sleep(0.05)
        return [self.context.create()]

class Sleeps(SearchMethod):
    def initial_operations(self):
        time.sleep(40)
"""


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the sandboxed searchers may write (they run as another uid)."""
    path = Path(tempfile.mkdtemp(prefix="cairn-searcher-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def constructed(shared: Path) -> list[str]:
    """The tags of every searcher object built so far, in order."""
    path = shared / "constructed"
    return path.read_text().split() if path.exists() else []


def counted(tag: str, shared: Path, max_trials: int = 2, gate: str | None = None) -> dict[str, Any]:
    """The searcher config of a :data:`COUNTED` searcher."""
    args: dict[str, Any] = {"log": str(shared), "tag": tag}
    if gate is not None:
        args["gate"] = gate
    return {
        "name": "custom",
        "searcher_class": "counted:Counted",
        "searcher_args": args,
        "max_trials": max_trials,
    }


async def report(store: EventStore, trial_id: int, *, complete: bool) -> None:
    """A validation of ``trial_id``, then its completion if ``complete``."""
    events: list[Any] = [
        ValidationReported(
            trial_id=trial_id, run_id=1, steps_completed=10, metrics={"validation_loss": 0.5}
        )
    ]
    if complete:
        events.append(TrialStateChanged(trial_id=trial_id, state="COMPLETED"))
    await store.append(trial_stream(trial_id), events)


async def of_type(store: EventStore, experiment_id: int, *types: str) -> list[Any]:
    """The payloads of the experiment stream's events of these types."""
    stream = await store.read_stream(f"experiment-{experiment_id}")
    return [e.payload for e in stream if e.type in types]


SETTLED = ("CustomSearcherAnswered", "CustomSearcherFailed")


async def test_rebuild_never_runs_an_ended_search_and_a_live_one_only_when_asked(
    store: EventStore, shared: Path
) -> None:
    """After a restart the searcher folds both custom searches from the log without building
    either user object; the live one is built again only when its next call is due, is fed its
    history in the sandbox (nothing of it recorded twice) and answers the new call once."""
    code = tarball({"counted.py": COUNTED})
    await submit(store, 1, counted("e1", shared, max_trials=1), code)
    await submit(store, 2, counted("e2", shared), code)
    searcher = Searcher(store, SandboxSettings())
    try:
        await searcher.settle()
        (first,) = await of_type(store, 1, "TrialRequested")
        await report(store, first["trial_id"], complete=True)
        await searcher.settle()
    finally:
        await searcher.close()
    ends = await of_type(store, 1, "ExperimentStateChanged")
    assert [e["state"] for e in ends] == ["STOPPING_COMPLETED"]
    await store.append("experiment-1", [ExperimentStateChanged(experiment_id=1, state="COMPLETED")])
    assert sorted(constructed(shared)) == ["e1", "e2"]
    owner = (shared / "constructed").stat().st_uid
    identity = default_identity()
    assert owner == (identity.uid if identity is not None else os.geteuid())

    restarted = Searcher(store, SandboxSettings())
    try:
        await restarted.rebuild()
        await restarted.settle()
        assert sorted(constructed(shared)) == ["e1", "e2"], "a rebuild built a searcher"
        assert restarted.workers.workers == {}, "no call is due, so no process runs"
        (live,) = await of_type(store, 2, "TrialRequested")
        await report(store, live["trial_id"], complete=False)
        await restarted.settle()
    finally:
        await restarted.close()
    assert sorted(constructed(shared)) == ["e1", "e2", "e2"]
    calls = [p["call"] for p in await of_type(store, 2, *SETTLED)]
    assert calls == [1, 2]
    assert len(await of_type(store, 2, "TrialRequested")) == 1
    assert await check_log(store) == []


async def test_a_slow_custom_searcher_holds_up_no_other_search(
    store: EventStore, shared: Path
) -> None:
    """While one experiment's searcher sleeps in initial_operations, another experiment's random
    search requests its trials and runs to its end; the sleeper then fails its own experiment
    with the time limit as the reason."""
    code = tarball({"counted.py": COUNTED})
    sleeper = {"name": "custom", "searcher_class": "counted:Sleeps", "max_trials": 2}
    await submit(store, 1, sleeper, code)
    random = {"name": "random", "max_trials": 2, "max_concurrent_trials": 2}
    other = {**CONFIG, "searcher": {"metric": "validation_loss", **random}}
    await store.append("experiment-2", [ExperimentSubmitted(experiment_id=2, config=other)])
    searcher = Searcher(store, SandboxSettings(call_timeout=10.0))
    try:
        await searcher.runner.catch_up()
        for trial in await of_type(store, 2, "TrialRequested"):
            await report(store, trial["trial_id"], complete=True)
        await searcher.runner.catch_up()
        (ended,) = await of_type(store, 2, "ExperimentStateChanged")
        assert ended["state"] == "STOPPING_COMPLETED"
        assert await of_type(store, 1, *SETTLED) == [], "the sleeper was still asked"
        assert searcher.consumer.custom[1].answers_due
        await searcher.settle()
    finally:
        await searcher.close()
    (failed,) = await of_type(store, 1, "ExperimentStateChanged")
    assert failed["state"] == "STOPPING_ERROR"
    assert failed["reason"] == (
        "custom searcher counted:Sleeps: initial_operations took more than 10 s"
    )
    assert await check_log(store) == []


async def test_a_stale_leader_or_a_second_worker_never_records_an_answer(
    store: EventStore, shared: Path
) -> None:
    """Two workers ask the same call at once: a leader fenced off by a newer election cannot
    record its answer, and of two workers of one term only the first answer is recorded (the
    other is stale); each call is settled once."""
    with capture_logs() as logs:
        code = tarball({"counted.py": COUNTED})
        gate = shared / "open"
        await submit(store, 1, counted("e1", shared, gate=str(gate)), code)
        lease = lease_stream("searcher")
        await store.append(lease, [LeaderElected(lease="searcher", holder="old")])
        old = Searcher(store, SandboxSettings(), fence=Fence("searcher", 1))
        new: Searcher | None = None
        try:
            await old.runner.catch_up()
            await wait_until(lambda: constructed(shared) == ["e1"], timeout=30)
            await store.append(lease, [LeaderElected(lease="searcher", holder="new")])
            new = Searcher(store, SandboxSettings(), fence=Fence("searcher", 2))
            await new.rebuild()
            await new.runner.catch_up()
            await wait_until(lambda: constructed(shared) == ["e1", "e1"], timeout=30)
            gate.touch()
            await new.settle()
            await wait_until(lambda: old.workers.workers[1].done, timeout=30)
        finally:
            await old.close()
            if new is not None:
                await new.close()
        (answer,) = [e for e in await store.read_stream("experiment-1") if e.type in SETTLED]
        assert answer.metadata.epoch == 2

        gate2 = shared / "open-2"
        await submit(store, 2, counted("e2", shared, gate=str(gate2)), code)
        first = Searcher(store, SandboxSettings())
        second = Searcher(store, SandboxSettings())
        try:
            await first.rebuild()
            await first.runner.catch_up()
            await second.rebuild()  # folds what the first one consumed, as a standby does
            await second.runner.catch_up()  # nothing new to fold: hands the due call to its worker
            await wait_until(lambda: constructed(shared).count("e2") == 2, timeout=30)
            gate2.touch()
            await first.settle()
            await wait_until(lambda: second.workers.workers[2].settled == 1, timeout=30)
            # The second worker may learn of the first's answer from the log before its own
            # sandbox answers: wait until its own answer came back and was dropped.
            await wait_until(
                lambda: (
                    ("custom searcher answer dropped as stale", 2)
                    in [(e["event"], e.get("experiment")) for e in logs]
                ),
                timeout=30,
            )
        finally:
            await first.close()
            await second.close()
    assert [p["call"] for p in await of_type(store, 2, *SETTLED)] == [1]
    assert await check_log(store) == []
    faults = [(e["event"], e["experiment"]) for e in logs if "experiment" in e]
    assert ("custom searcher worker fenced off", 1) in faults
    assert ("custom searcher answer dropped as stale", 2) in faults


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
