"""Custom searchers on a live cluster of processes, two ordinary users: one user's sleeping and
spinning searchers cost the other user's random search no time, fail only their own experiments,
are never run again once ended (a searcher SIGKILL and restart included), and find no credential
and no network from inside their sandbox.

A cluster of processes and searchers that run into their time limit cost ~40 s on two cores:
this runs under ``make test-search`` (``CAIRN_SEARCH_E2E=1``) and is skipped otherwise. The
sandbox switches uid, so it needs root.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import psutil
import pytest

from cairn.client import code_tarball
from cairn.local.servers import ServerProcess
from events.domain.check import check_log
from events.domain.names import experiment_stream, trial_stream
from events.log.store import EventStore, lease_stream
from tests.e2e.harness import Cluster, experiment_state, wait_for
from tests.e2e.test_trials import SCRIPTED, scripted
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("CAIRN_SEARCH_E2E"),
        reason="a live-cluster search test: make test-search",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches uid: needs root"),
]

CALL_TIMEOUT = 10
"""The cluster's ``CAIRN_CUSTOM_SEARCHER_TIMEOUT`` (its default); the sleepers sleep 40 s."""
MARGIN = 2.0
"""Most seconds the hostile searchers may add to the other user's first trial."""
NEEDLES = (
    "CAIRN_DB=",
    "CAIRN_NATS=",
    "CAIRN_AGENT_TOKEN=",
    "postgresql://",
    "CAIRN_DB_FILE=",
    "CAIRN_NATS_FILE=",
    "CAIRN_AGENT_TOKEN_FILE=",
)
"""What a cluster credential in a process's environment looks like, or the path of the file a
service reads one from (the services hold only those)."""

HOSTILE = '''
import glob, json, os, socket, time
from cairn.searcher import SearchMethod


class Noted(SearchMethod):
    """Writes its tag to LOG/constructed each time the searcher service builds it."""

    def __init__(self, context, log, tag, **args):
        super().__init__(context, **args)
        with open(os.path.join(log, "constructed"), "a") as out:
            out.write(tag + "\\n")


class Sleeps(Noted):
    def initial_operations(self):
        time.sleep(40)


class Spins(Noted):
    def initial_operations(self):
        while True:
            pass


def probe(needles, ports):
    """Every readable /proc/*/environ holding a credential, and what connecting to each
    port gives."""
    readable, leaks = 0, []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        readable += 1
        if any(n.encode() in data for n in needles):
            leaks.append(path)
    reached = []
    for port in ports:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            reached.append("connected")
        except OSError as exc:
            reached.append(type(exc).__name__)
    return {"uid": os.getuid(), "environs": readable, "leaks": leaks, "ports": reached}


class Probe(Noted):
    def initial_operations(self):
        found = probe(self.searcher_args["needles"], self.searcher_args["ports"])
        raise RuntimeError("probe " + json.dumps(found, separators=(",", ":")))
'''


class User:
    """An ordinary user of the cluster, logged in."""

    def __init__(self, cluster: Cluster, name: str, token: str) -> None:
        self.cluster = cluster
        self.name = name
        self.token = token

    async def submit(self, config: dict[str, Any], code_dir: Path) -> int:
        """Creates an active experiment from ``config`` and ``code_dir``; returns its id."""
        body = {
            "config": config,
            "code": base64.b64encode(code_tarball(code_dir)).decode(),
            "activate": True,
        }
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{self.cluster.api_url}/api/v1/experiments",
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
            ) as resp,
        ):
            data = await resp.json()
            assert resp.status < 400, f"{self.name} could not submit: {resp.status} {data}"
            return int(data["id"])


async def ordinary_user(cluster: Cluster, name: str) -> User:
    """Creates ``name`` (not an admin) as the admin, and logs in as them."""
    password = f"{name}-password-0123"
    await cluster.request("POST", "/users", {"username": name, "password": password})
    admin = cluster.token
    cluster.token = ""
    try:
        data = await cluster.request(
            "POST", "/auth/login", {"username": name, "password": password}
        )
    finally:
        cluster.token = admin
    return User(cluster, name, data["token"])


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the sandboxed searchers may write (they run as another uid)."""
    path = Path(tempfile.mkdtemp(prefix="cairn-isolation-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def cluster(
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Cluster]:
    """Every service as a process, its custom searchers limited to CALL_TIMEOUT s a call."""
    monkeypatch.setenv("CAIRN_CUSTOM_SEARCHER_TIMEOUT", str(CALL_TIMEOUT))
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=4)
    try:
        await c.login()
        yield c
    finally:
        c.stop()


def constructed(shared: Path) -> list[str]:
    """The tags of every searcher object built so far, in order."""
    path = shared / "constructed"
    return path.read_text().split() if path.exists() else []


def sandboxes() -> list[int]:
    """Pids of live custom searcher processes on this machine."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            named = "services.searcher.custom_host" in (proc.info["cmdline"] or [])
            if named and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out


def describe(pids: list[int]) -> str:
    """What each of ``pids`` is, for a failure's message."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out.append(
                f"{pid} ppid={proc.ppid()} uid={proc.uids().real} {proc.status()} {proc.cmdline()[:8]}"
            )
        except psutil.Error as exc:
            out.append(f"{pid}: {exc}")
    return "\n".join(out)


def random_search(checkpoints: Path) -> dict[str, Any]:
    """Two short scripted trials under a random search."""
    config = scripted(checkpoints, steps=10, report_every=5, checkpoint_every=0, sleep=0.01)
    config["searcher"] = {
        "name": "random",
        "metric": "validation_loss",
        "max_trials": 2,
        "max_concurrent_trials": 2,
    }
    return config


def custom(checkpoints: Path, cls: str, shared: Path, tag: str, **args: Any) -> dict[str, Any]:
    """A search by ``hostile:<cls>``, noting its constructions with ``tag``."""
    config = scripted(checkpoints, steps=10)
    config["searcher"] = {
        "name": "custom",
        "metric": "validation_loss",
        "searcher_class": f"hostile:{cls}",
        "searcher_args": {"log": str(shared), "tag": tag, **args},
        "max_trials": 2,
    }
    return config


async def first_trial_delay(
    cluster: Cluster, store: EventStore, user: User, config: dict[str, Any]
) -> tuple[int, float, float]:
    """Submits ``config`` as ``user``; returns the experiment and the seconds from the request
    to its first ``TrialRequested`` in the log, and to its first trial's ``TrialStarted``."""
    start = time.monotonic()
    exp = await user.submit(config, SCRIPTED)

    async def requested() -> list[int]:
        stream = await store.read_stream(experiment_stream(exp))
        return [int(e.payload["trial_id"]) for e in stream if e.type == "TrialRequested"]

    trials = await wait_until_fast(cluster, requested)
    decided = time.monotonic() - start

    async def started() -> bool:
        for trial in trials:
            if any(e.type == "TrialStarted" for e in await store.read_stream(trial_stream(trial))):
                return True
        return False

    await wait_until_fast(cluster, started)
    return exp, decided, time.monotonic() - start


async def wait_until_fast(cluster: Cluster, predicate: Any, timeout: float = 120.0) -> Any:
    """:func:`wait_for` polling every 20 ms (the delay measured is a few tenths of a second)."""
    return await wait_until(predicate, timeout, every=0.02, detail=cluster.logs)


async def reason_of(store: EventStore, experiment_id: int) -> str:
    """The reason the experiment was stopped with an error."""
    stream = await store.read_stream(experiment_stream(experiment_id))
    (failed,) = [
        e.payload["reason"]
        for e in stream
        if e.type == "ExperimentStateChanged" and e.payload["state"] == "STOPPING_ERROR"
    ]
    return str(failed)


@pytest.mark.timeout(420)
async def test_hostile_custom_searchers_cost_another_user_nothing(
    cluster: Cluster, store: EventStore, tmp_path: Path, shared: Path
) -> None:
    """user-a's two sleeping searchers and one spinning searcher run while user-b's random
    search gets its first trial within MARGIN s of the time it took alone and completes; they
    end in ERROR with the time limit as the reason; after a searcher SIGKILL (which takes its
    sandboxes down with it) and restart, no ended experiment's searcher is built again; and a
    searcher probing its sandbox finds no credential and reaches no port, where the same probe
    run as the service does."""
    user_a = await ordinary_user(cluster, "user-a")
    user_b = await ordinary_user(cluster, "user-b")
    code = tmp_path / "hostile"
    code.mkdir()
    (code / "hostile.py").write_text(HOSTILE)
    ckpt = tmp_path / "ckpt"

    async def completed(exp: int) -> None:
        async def done() -> bool:
            return await experiment_state(store, exp) == "COMPLETED"

        await wait_for(cluster, done, timeout=120)

    alone_exp, alone, alone_started = await first_trial_delay(
        cluster, store, user_b, random_search(ckpt)
    )
    await completed(alone_exp)

    hostile = {
        tag: await user_a.submit(custom(ckpt, cls, shared, tag), code)
        for tag, cls in (("sleeper-1", "Sleeps"), ("sleeper-2", "Sleeps"), ("spinner", "Spins"))
    }
    await wait_for(cluster, lambda: len(constructed(shared)) == 3, timeout=60)
    beside_exp, beside, beside_started = await first_trial_delay(
        cluster, store, user_b, random_search(ckpt)
    )
    measured = (
        f"user-b's first trial was requested after {alone:.2f} s alone and {beside:.2f} s "
        f"beside the hostile searchers, and running after {alone_started:.2f} s and "
        f"{beside_started:.2f} s"
    )
    print(measured)
    assert beside <= alone + MARGIN and beside_started <= alone_started + MARGIN, measured
    assert all([await experiment_state(store, e) is None for e in hostile.values()]), (
        "the hostile searchers were still in their calls"
    )
    await completed(beside_exp)

    async def hostile_ended() -> bool:
        states = [await experiment_state(store, e) for e in hostile.values()]
        return states == ["ERROR"] * 3

    await wait_for(cluster, hostile_ended, timeout=120)
    for tag, exp in hostile.items():
        cls = "Spins" if tag == "spinner" else "Sleeps"
        assert await reason_of(store, exp) == (
            f"custom searcher hostile:{cls}: initial_operations took more than {CALL_TIMEOUT} s"
        )

    late = await user_a.submit(custom(ckpt, "Sleeps", shared, "late"), code)
    await wait_for(cluster, lambda: constructed(shared)[-1:] == ["late"], timeout=60)
    assert sandboxes(), "the late searcher's sandbox runs"
    cluster.kill("searcher")
    assert cluster.procs["searcher"].returncode == -9, "the searcher died of SIGKILL"
    await wait_until(lambda: sandboxes() == [], 30, detail=lambda: describe(sandboxes()))
    cluster.start("searcher", "services.searcher")

    async def reelected() -> bool:
        return len(await store.read_stream(lease_stream("searcher"))) >= 2

    await wait_for(cluster, reelected, timeout=60)

    async def late_failed() -> bool:
        return await experiment_state(store, late) == "ERROR"

    await wait_for(cluster, late_failed, timeout=120)
    built = Counter(constructed(shared))
    assert built == {"sleeper-1": 1, "sleeper-2": 1, "spinner": 1, "late": 2}, (
        f"only the live experiment's searcher may be built again after the restart: {built}"
    )
    owner = (shared / "constructed").stat().st_uid
    assert owner != os.geteuid(), "searchers write as another uid than the services'"

    ports = [cluster.api_port, int(urlparse(cluster.db_url).port or 0)]
    control = probe_here(tmp_path, list(NEEDLES), ports)
    assert control["leaks"] and control["ports"] == ["connected", "connected"], control
    spy = await user_a.submit(
        custom(ckpt, "Probe", shared, "probe", needles=list(NEEDLES), ports=ports), code
    )

    async def probed() -> bool:
        return await experiment_state(store, spy) == "ERROR"

    await wait_for(cluster, probed, timeout=60)
    reason = await reason_of(store, spy)
    found = json.loads(reason.split("RuntimeError: probe ", 1)[1])
    assert found["uid"] != os.geteuid() and found["leaks"] == [], found
    assert "connected" not in found["ports"], found

    requests = Counter(
        (e.payload["experiment_id"], e.payload["request_id"])
        for e in await store.read_all(limit=1_000_000, types=["TrialRequested"])
    )
    assert [r for r, n in requests.items() if n > 1] == [], "a trial was requested twice"
    assert [str(f) for f in await check_log(store)] == []


def probe_here(tmp_path: Path, needles: list[str], ports: list[int]) -> dict[str, Any]:
    """The searchers' probe, run by the test as the services run (the control)."""
    namespace: dict[str, Any] = {}
    source = HOSTILE.replace("from cairn.searcher import SearchMethod", "SearchMethod = object")
    exec(compile(source, str(tmp_path / "hostile.py"), "exec"), namespace)
    result: dict[str, Any] = namespace["probe"](needles, ports)
    return result
