"""Trials end to end: no-op trial throughput and training throughput, cairn vs bare processes.

A whole cluster of real processes (relay, searcher, scheduler, API and one 2-slot agent) runs on
a fresh database of the bench's durable PostgreSQL and a nats-server of its own. Two figures:

1. No-op trials per second on 2 slots: one ``grid`` experiment of N scripted trials that each
   complete one step (``examples/scripted``, ``steps=1 sleep=0 checkpoint_every=0``), timed from
   the POST to the ``COMPLETED`` state's ``recorded_at``; the baseline launches the same script
   N times off-cluster as bare subprocesses, 2 at a time. Beside it: the same work per
   CPU-second (every process of the cluster, PostgreSQL and nats-server included, against the
   bare runs' own), which other load on the machine disturbs less; and each trial's start phase
   by phase (median and p90: requested -> allocated -> command delivered -> process started ->
   first output -> first report -> exit; see :mod:`bench._trial_start` for which fact or log
   line marks each).
2. Training throughput of ``examples/digits/train.py`` (fixed hyperparameters, a fixed number of
   batches): batches/s between its first and last validation line (process start, data loading
   and imports excluded), bare (lines stamped as this process reads them from the pipe) and as a
   single-trial experiment (lines stamped as the agent reads them, ``task_logs.ts``).

The bare baselines run first, before the cluster starts, so they do not share the CPUs with it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import io
import json
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench._trial_start import (
    PhaseStats,
    TrialMarks,
    breakdown,
    cpu_seconds,
    cpu_used,
    marks_from_events,
    missing_marks,
    read_agent_marks,
)
from bench.common import BenchContext, Measure, Report, per_second, print_table, progress
from cairn.local.processes import ProcessCluster
from cairn.local.servers import ServerProcess, start_nats
from events.domain.config import load_yaml
from events.domain.names import experiment_stream, trial_stream
from events.log.envelope import RecordedEvent
from events.log.store import EventStore

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = ROOT / "examples" / "scripted"
DIGITS = ROOT / "examples" / "digits"
SLOTS = 2
NOOP_HPARAMS: dict[str, Any] = {"steps": 1, "sleep": 0, "checkpoint_every": 0}
DIGITS_HPARAMS: dict[str, Any] = {"lr": 0.01, "hidden": 128, "dropout": 0.1, "batch_size": 32}
VALIDATE_EVERY = 100
NOOP_TARGET = 0.9
"""The goal for no-op trials per second, as a fraction of bare subprocesses' rate."""
TERMINAL_POLL = 0.25
"""Seconds between the bench's looks for the experiment's end: the figures come from the events'
``recorded_at``, so a slower look only notices later, and keeps the bench's own queries off the
CPUs the trials and services share."""
TERMINAL = ("COMPLETED", "ERROR", "CANCELED")
_BATCH_LINE = re.compile(r"^batch (\d+): .*\(([\d.]+)s\)\s*$")


class FineMeasure(Measure):
    """A measure whose figures are printed with two decimals (small rates, latencies)."""

    decimals = 2


def _code_tarball(directory: Path) -> str:
    """The directory as a base64 tar.gz, as the CLI uploads it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                tar.add(path, arcname=str(path.relative_to(directory)))
    return base64.b64encode(buf.getvalue()).decode()


def _stop_process(proc: subprocess.Popen[Any], deadline: float) -> None:
    """SIGKILLs ``proc``'s process group if it has not exited by ``deadline`` (monotonic)."""
    try:
        proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


# --------------------------------------------------------------------------------------------
# the cluster


@dataclass
class _Cluster(ProcessCluster):
    """The services as processes on one database and one nats-server; an HTTP client for the API."""

    token: str = ""
    http: aiohttp.ClientSession | None = None
    servers: dict[str, int] = field(default_factory=dict)
    """The pids of the PostgreSQL and nats-server it runs on, by name (for CPU accounting)."""

    def pids(self) -> dict[str, int]:
        """Every process of the cluster and its servers, by name (the agent is ``a``)."""
        return {**{name: proc.pid for name, proc in self.procs.items()}, **self.servers}

    async def launch(self) -> None:
        """Starts every service and the agent (checkpoints allowed under the work directory,
        where the bench keeps them); logs in once the API answers."""
        self.allow_checkpoints_under(self.workdir)
        await asyncio.to_thread(self.start_services)
        self.start_agent("a", SLOTS, "--heartbeat", "0.5")
        self.http = aiohttp.ClientSession()
        await self._login()

    async def close(self) -> None:
        """Closes the HTTP session and stops the processes."""
        if self.http is not None:
            await self.http.close()
        await asyncio.to_thread(self.stop)

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        assert self.http is not None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        url = f"{self.api_url}/api/v1{path}"
        async with self.http.request(method, url, json=body, headers=headers) as resp:
            data = await resp.json()
            if resp.status >= 400:
                raise RuntimeError(f"{method} {path} -> {resp.status}: {data}")
            return data

    async def _login(self) -> None:
        for _ in range(200):
            try:
                data = await self.request(
                    "POST", "/auth/login", {"username": "admin", "password": self.admin_password}
                )
                self.token = data["token"]
                return
            except (aiohttp.ClientError, RuntimeError):
                self.check_alive()
                await asyncio.sleep(0.1)
        raise RuntimeError("could not log in to the API")

    async def submit(self, config: dict[str, Any], code: str) -> int:
        body = {"config": config, "code": code, "activate": True}
        data = await self.request("POST", "/experiments", body)
        return int(data["id"])


@contextlib.asynccontextmanager
async def _cluster_on(
    ctx: BenchContext, database: str, work: Path, *, stopping: str = ""
) -> AsyncIterator[tuple[_Cluster, EventStore]]:
    """A :class:`_Cluster` (not started) and a store on a fresh database ``database``, with a
    nats-server of its own under ``work``.

    On the way out the cluster's logs are printed if the body failed, then ``stopping`` (if any)
    is printed as progress and the cluster, the store and the nats-server are stopped.
    """
    nats: ServerProcess | None = None
    cluster: _Cluster | None = None
    store: EventStore | None = None
    try:
        dsn = await ctx.create_database(database)
        store = await EventStore.connect(dsn, max_size=2)
        nats = await asyncio.to_thread(start_nats, work / "nats")
        cluster = _Cluster(dsn, nats.url, work)
        cluster.servers = {"postgres": ctx.server.proc.pid, "nats": nats.proc.pid}
        yield cluster, store
    except BaseException:
        if cluster is not None:
            print(cluster.logs(), flush=True)
        raise
    finally:
        if stopping:
            progress(stopping)
        if cluster is not None:
            await cluster.close()
        if store is not None:
            await store.close()
        if nats is not None:
            await asyncio.to_thread(nats.stop)


async def _wait_for_agent(store: EventStore, cluster: _Cluster, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await store.read_all(types=["AgentRegistered"], limit=1):
            return
        cluster.check_alive()
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the agent did not register in {timeout:.0f}s\n{cluster.logs()}")


async def _wait_terminal(
    store: EventStore, cluster: _Cluster, experiment_id: int, timeout: float
) -> RecordedEvent:
    """Polls the log until the experiment reaches a terminal state; returns that event."""
    deadline = time.monotonic() + timeout
    after = 0
    while time.monotonic() < deadline:
        for event in await store.read_all(after, types=["ExperimentStateChanged"]):
            after = event.position
            if event.payload["experiment_id"] == experiment_id and (
                event.payload["state"] in TERMINAL
            ):
                if event.payload["state"] != "COMPLETED":
                    raise RuntimeError(
                        f"experiment {experiment_id} ended {event.payload['state']}: "
                        f"{event.payload.get('reason')}\n{cluster.logs()}"
                    )
                return event
        cluster.check_alive()
        await asyncio.sleep(TERMINAL_POLL)
    raise RuntimeError(f"experiment {experiment_id} not done in {timeout:.0f}s\n{cluster.logs()}")


@dataclass(frozen=True)
class _Ended:
    """A single-trial experiment that ran to its end."""

    experiment_id: int
    trial_id: int
    done: RecordedEvent
    """Its terminal ``ExperimentStateChanged``."""
    events: list[RecordedEvent]
    """Its trial's stream."""


async def _run_one_trial(
    cluster: _Cluster, store: EventStore, config: dict[str, Any], code: Path, timeout: float
) -> _Ended:
    """Submits a single-trial experiment of ``config`` and ``code``, waits until it ends."""
    experiment_id = await cluster.submit(config, _code_tarball(code))
    done = await _wait_terminal(store, cluster, experiment_id, timeout=timeout)
    (trial_id,) = [
        int(e.payload["trial_id"])
        for e in await store.read_stream(experiment_stream(experiment_id))
        if e.type == "TrialRequested"
    ]
    events = await store.read_stream(trial_stream(trial_id))
    return _Ended(experiment_id, trial_id, done, events)


def _config(config_file: Path, hparams: dict[str, Any], checkpoints: Path) -> dict[str, Any]:
    """An example's experiment config with ``hparams`` set and checkpoints under ``checkpoints``."""
    config: dict[str, Any] = copy.deepcopy(load_yaml(config_file.read_text(), str(config_file)))
    config["hyperparameters"].update(hparams)
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(checkpoints)}
    return config


def _argv(hparams: dict[str, Any]) -> list[str]:
    """``key=value`` arguments of the examples' off-cluster mode (values as JSON)."""
    return [f"{k}={json.dumps(v)}" for k, v in hparams.items()]


# --------------------------------------------------------------------------------------------
# 1. no-op trials


async def _bare_noop(n: int, tmp: Path) -> tuple[float, list[float], float]:
    """Runs the no-op script ``n`` times, ``SLOTS`` at a time; (wall seconds, per-run seconds,
    CPU seconds of the runs)."""
    gate = asyncio.Semaphore(SLOTS)
    durations: list[float] = []

    async def one(i: int) -> None:
        async with gate:
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "train.py",
                *_argv({**NOOP_HPARAMS, "index": i}),
                "--checkpoint-dir",
                str(tmp / f"noop-{i}"),
                cwd=SCRIPTED,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            durations.append(time.perf_counter() - t0)
            if code != 0:
                raise RuntimeError(f"bare no-op run {i} exited {code}")

    await one(-1)  # warm-up (page cache); not counted
    durations.clear()
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0, durations, _children_cpu() - cpu0


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (the bare runs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _cairn_noop(
    cluster: _Cluster, store: EventStore, n: int, tmp: Path, report: Report
) -> tuple[float, list[float], float]:
    """Submits the grid of ``n`` no-op trials; (POST -> COMPLETED seconds, per-trial latencies,
    CPU seconds of the cluster's processes, its servers' and the trials')."""
    config = _config(SCRIPTED / "config.yaml", NOOP_HPARAMS, tmp / "noop-checkpoints")
    config["name"] = "bench-noop"
    config["hyperparameters"]["index"] = {"type": "categorical", "vals": list(range(n))}
    config["searcher"] = {
        "name": "grid",
        "metric": "validation_loss",
        "max_concurrent_trials": n,
    }
    config["max_restarts"] = 0
    code = _code_tarball(SCRIPTED)
    cpu_before = cpu_seconds(cluster.pids(), split="a")
    posted = datetime.now(UTC)
    experiment_id = await cluster.submit(config, code)
    done = await _wait_terminal(store, cluster, experiment_id, timeout=120)
    seconds = (done.recorded_at - posted).total_seconds()
    cpu = cpu_used(cpu_before, cpu_seconds(cluster.pids(), split="a"))

    requested: dict[int, datetime] = {}
    for event in await store.read_stream(experiment_stream(experiment_id)):
        if event.type == "TrialRequested":
            requested[event.payload["trial_id"]] = event.recorded_at
    if len(requested) != n:
        raise RuntimeError(f"{len(requested)} trials requested, expected {n}")
    latencies, runs, waits = [], [], []
    trials: list[TrialMarks] = []
    for trial_id, t_requested in requested.items():
        events = await store.read_stream(trial_stream(trial_id))
        exits = [e for e in events if e.type == "TrialExited"]
        starts = [e for e in events if e.type == "TrialStarted"]
        if not exits or exits[-1].payload["outcome"] != "completed":
            raise RuntimeError(f"trial {trial_id} did not complete: {exits}")
        latencies.append((exits[-1].recorded_at - t_requested).total_seconds())
        if starts:
            runs.append((exits[-1].recorded_at - starts[0].recorded_at).total_seconds())
            waits.append((starts[0].recorded_at - t_requested).total_seconds())
        trials.append(marks_from_events(trial_id, t_requested, events))
    await _add_run_marks(cluster, store, trials)
    report.details["noop_cairn"] = {
        "experiment_id": experiment_id,
        "trials": n,
        "post_to_completed_s": round(seconds, 3),
        "mean_requested_to_exited_s": round(statistics.fmean(latencies), 4),
        "mean_requested_to_started_s": round(statistics.fmean(waits), 4) if waits else None,
        "mean_started_to_exited_s": round(statistics.fmean(runs), 4) if runs else None,
        "max_requested_to_exited_s": round(max(latencies), 4),
    }
    report.details["noop_cpu_ms_per_trial"] = {
        ("trial processes" if name == "a children" else name): round(v * 1000 / n, 1)
        for name, v in sorted(cpu.items(), key=lambda kv: -kv[1])
    }
    phases = breakdown(trials, SLOTS)
    report.details["noop_start_breakdown"] = [p.to_json() for p in phases]
    missing = missing_marks(trials)
    if missing:
        report.details["noop_start_missing_marks"] = missing
        report.notes.append(f"trial start breakdown: marks missing for some trials: {missing}")
    _print_breakdown(phases)
    report.notes.append(
        "trial start, median (p90) ms: "
        + "; ".join(f"{p.name} {p.median * 1000:.0f} ({p.p90 * 1000:.0f})" for p in phases)
    )
    return seconds, latencies, sum(cpu.values())


async def _add_run_marks(cluster: _Cluster, store: EventStore, trials: list[TrialMarks]) -> None:
    """Adds the agent's marks (its log lines) and each run's first output line (``task_logs``)."""
    by_allocation = read_agent_marks(cluster.workdir / "a.log")
    ids = [t.allocation_id for t in trials if t.allocation_id]
    async with store.connection() as conn:
        rows = await conn.fetch(
            "SELECT allocation_id, min(ts) AS first FROM task_logs"
            " WHERE allocation_id = ANY($1::text[]) GROUP BY allocation_id",
            ids,
        )
    first_output = {str(r["allocation_id"]): r["first"] for r in rows}
    for trial in trials:
        trial.times.update(by_allocation.get(trial.allocation_id, {}))
        if trial.allocation_id in first_output:
            trial.times["first_output"] = first_output[trial.allocation_id]


def _bound_note(cpu_ms: dict[str, float], bare_ms: float) -> str:
    """What bounds the no-op ratio where the CPUs are the limit: the services' CPU per trial and
    what a trial's process spends beyond a bare run's, against the bare run's own."""
    trial_ms = cpu_ms.get("trial processes", 0.0)
    services_ms = sum(ms for name, ms in cpu_ms.items() if name != "trial processes")
    extra_ms = trial_ms - bare_ms
    bound = bare_ms / (bare_ms + services_ms + max(extra_ms, 0.0)) if bare_ms > 0 else 0.0
    return (
        f"no-op bound where the CPUs are the limit: a bare run {bare_ms:.0f} ms CPU; per trial the "
        f"services, PostgreSQL and nats-server {services_ms:.0f} ms, the trial's process "
        f"{extra_ms:+.0f} ms beyond a bare run (confinement, the Core API's HTTP client and "
        f"reports): at most ~{bound:.2f}x; it moves with less CPU per trial in the services and "
        "the trial's client, not with a faster interpreter start, which bare runs share"
    )


def _print_breakdown(phases: Sequence[PhaseStats]) -> None:
    """Prints the phases of a trial's start as a table (milliseconds)."""
    progress("  trial start, phase by phase (ms):")
    print_table(
        ["phase", "median", "p90", "trials", "what"],
        [
            [p.name, f"{p.median * 1000:.0f}", f"{p.p90 * 1000:.0f}", str(p.count), p.what]
            for p in phases
        ],
        indent=4,
    )


# --------------------------------------------------------------------------------------------
# 2. digits training throughput


def _rate_from_lines(lines: Sequence[tuple[float, str]]) -> dict[str, Any]:
    """Batches/s between the first and last ``batch N: ... (Xs)`` lines.

    ``wall``: from the times the lines were read; ``script``: from the script's own timer.
    """
    points = []
    for stamp, line in lines:
        match = _BATCH_LINE.match(line.strip())
        if match:
            points.append((int(match.group(1)), stamp, float(match.group(2))))
    if len(points) < 2:
        raise RuntimeError(f"fewer than two report lines in the output: {lines[-5:]}")
    (b0, w0, s0), (b1, w1, s1) = points[0], points[-1]
    return {
        "first_batch": b0,
        "last_batch": b1,
        "reports": len(points),
        "wall_s": round(w1 - w0, 4),
        "wall_batches_per_s": per_second(b1 - b0, w1 - w0),
        "script_s": round(s1 - s0, 2),
        "script_batches_per_s": per_second(b1 - b0, s1 - s0),
    }


def _bare_digits_blocking(
    batches: int, tmp: Path, procs: list[subprocess.Popen[str]]
) -> dict[str, Any]:
    hparams = {**DIGITS_HPARAMS, "max_batches": batches, "validate_every": VALIDATE_EVERY}
    with open(tmp / "digits-bare.stderr", "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "train.py", *_argv(hparams), "--checkpoint-dir", str(tmp / "dbare")],
            cwd=DIGITS,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
    procs.append(proc)
    assert proc.stdout is not None
    lines: list[tuple[float, str]] = []
    t0 = time.time()
    for line in proc.stdout:
        lines.append((time.time(), line))
    code = proc.wait(600)
    if code != 0:
        raise RuntimeError(f"bare digits exited {code}; see {tmp / 'digits-bare.stderr'}")
    return {**_rate_from_lines(lines), "process_s": round(time.time() - t0, 2)}


async def _bare_digits(batches: int, tmp: Path) -> dict[str, Any]:
    procs: list[subprocess.Popen[str]] = []
    try:
        return await asyncio.to_thread(_bare_digits_blocking, batches, tmp, procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                await asyncio.to_thread(_stop_process, proc, time.monotonic() + 5)


async def _cairn_digits(
    cluster: _Cluster, store: EventStore, batches: int, tmp: Path
) -> dict[str, Any]:
    hparams = {**DIGITS_HPARAMS, "max_batches": batches, "validate_every": VALIDATE_EVERY}
    config = _config(DIGITS / "const.yaml", hparams, tmp / "digits-checkpoints")
    config["name"] = "bench-digits"
    config["max_restarts"] = 0
    ended = await _run_one_trial(cluster, store, config, DIGITS, timeout=300)
    trial_id = ended.trial_id
    started = next(e for e in ended.events if e.type == "TrialStarted")
    exited = [e for e in ended.events if e.type == "TrialExited"][-1]
    last = f"batch {batches}:"
    deadline = time.monotonic() + 30
    rows: list[Any] = []
    while time.monotonic() < deadline:  # the agent ships its last log lines around the exit
        async with store.connection() as conn:
            rows = await conn.fetch(
                "SELECT ts, line FROM task_logs WHERE trial_id = $1 ORDER BY id", trial_id
            )
        if any(r["line"].startswith(last) for r in rows):
            break
        await asyncio.sleep(0.1)
    result = _rate_from_lines([(r["ts"].timestamp(), r["line"]) for r in rows])
    result["experiment_id"] = ended.experiment_id
    result["started_to_exited_s"] = round(
        (exited.recorded_at - started.recorded_at).total_seconds(), 3
    )
    result["started_to_completed_s"] = round(
        (ended.done.recorded_at - started.recorded_at).total_seconds(), 3
    )
    return result


# --------------------------------------------------------------------------------------------


async def run(ctx: BenchContext) -> Report:
    """Runs the bare baselines, starts a cluster, runs the same work on it; returns the figures."""
    report = Report()
    n = ctx.scaled(40, minimum=4)
    batches = ctx.scaled(6000, minimum=2 * VALIDATE_EVERY)
    work = ctx.tmp / "trials"
    work.mkdir(parents=True, exist_ok=True)

    progress(f"trials: bare baseline, {n} no-op scripted runs as subprocesses, {SLOTS} at a time")
    bare_seconds, bare_runs, bare_cpu = await _bare_noop(n, work / "bare")
    bare_rate = per_second(n, bare_seconds)
    progress(
        f"  {bare_rate:.2f} runs/s ({bare_seconds:.2f}s; mean run {statistics.fmean(bare_runs):.3f}s;"
        f" {bare_cpu * 1000 / n:.0f} ms CPU per run)"
    )
    progress(f"trials: bare digits, {batches:,} batches")
    bare_digits = await _bare_digits(batches, work / "bare")
    progress(
        f"  {bare_digits['wall_batches_per_s']:,.0f} batches/s over batches "
        f"{bare_digits['first_batch']}-{bare_digits['last_batch']} "
        f"({bare_digits['wall_s']:.2f}s; script's timer {bare_digits['script_batches_per_s']:,.0f})"
    )

    async with _cluster_on(ctx, "bench_trials", work, stopping="trials: stopping the cluster") as (
        cluster,
        store,
    ):
        progress("trials: starting relay, searcher, scheduler, api and a 2-slot agent")
        t0 = time.perf_counter()
        await cluster.launch()
        await _wait_for_agent(store, cluster)
        progress(f"  cluster up in {time.perf_counter() - t0:.1f}s")

        progress(f"trials: cairn, one grid experiment of {n} no-op trials on {SLOTS} slots")
        cairn_seconds, latencies, cairn_cpu = await _cairn_noop(cluster, store, n, work, report)
        cairn_rate = per_second(n, cairn_seconds)
        mean_latency = statistics.fmean(latencies)
        progress(
            f"  {cairn_rate:.2f} trials/s ({cairn_seconds:.2f}s POST -> COMPLETED); mean "
            f"TrialRequested -> TrialExited {mean_latency:.2f}s; "
            f"mean start -> exit {report.details['noop_cairn']['mean_started_to_exited_s']}s"
        )
        cpu_split = ", ".join(
            f"{name} {ms:.0f}" for name, ms in report.details["noop_cpu_ms_per_trial"].items()
        )
        progress(f"  CPU per trial {cairn_cpu * 1000 / n:.0f} ms: {cpu_split}")

        progress(f"trials: cairn digits, single-trial experiment, {batches:,} batches")
        cairn_digits = await _cairn_digits(cluster, store, batches, work)
        progress(
            f"  {cairn_digits['wall_batches_per_s']:,.0f} batches/s over batches "
            f"{cairn_digits['first_batch']}-{cairn_digits['last_batch']} "
            f"({cairn_digits['wall_s']:.2f}s; script's timer "
            f"{cairn_digits['script_batches_per_s']:,.0f})"
        )

    report.measures += [
        FineMeasure(
            f"no-op trials, {SLOTS} slots, submit->exit (trials/s)",
            cairn_rate,
            bare_rate,
            f"bare subprocesses, {SLOTS} at a time",
            unit="trials/s",
            count=n,
            notes="cairn: POST /experiments to COMPLETED recorded_at, one grid experiment",
            target=f">= {NOOP_TARGET}x",
            met=cairn_rate >= NOOP_TARGET * bare_rate,
        ),
        FineMeasure(
            "no-op trials per CPU-second (trials/CPU-s)",
            per_second(n, cairn_cpu),
            per_second(n, bare_cpu),
            "bare subprocesses",
            unit="trials/CPU-s",
            count=n,
            notes="cairn: the trials' processes and every service's, PostgreSQL's and "
            "nats-server's CPU time from the POST to COMPLETED (less disturbed by other load)",
            target=f">= {NOOP_TARGET}x",
            met=cairn_cpu * NOOP_TARGET <= bare_cpu,
        ),
        FineMeasure(
            "no-op trial latency, TrialRequested->TrialExited (s)",
            mean_latency,
            None,
            "",
            unit="s",
            count=n,
            notes="mean over the trials; includes queueing for the 2 slots (lower is better)",
        ),
        Measure(
            "digits MLP training (batches/s)",
            cairn_digits["wall_batches_per_s"],
            bare_digits["wall_batches_per_s"],
            "bare subprocess",
            unit="batches/s",
            count=batches,
            notes="between the first and last validation lines (process start excluded)",
        ),
    ]
    report.details.update(
        noop_bare={
            "runs": n,
            "seconds": round(bare_seconds, 3),
            "mean_run_s": round(statistics.fmean(bare_runs), 4),
            "cpu_ms_per_run": round(bare_cpu * 1000 / n, 1),
        },
        digits={
            "hparams": {**DIGITS_HPARAMS, "validate_every": VALIDATE_EVERY},
            "batches": batches,
            "bare": bare_digits,
            "cairn": cairn_digits,
        },
    )
    report.notes += [
        f"{os.cpu_count()} CPUs: the cluster's services share them with the trials",
        _bound_note(report.details["noop_cpu_ms_per_trial"], bare_cpu * 1000 / n),
        f"digits, script's own timer: cairn {cairn_digits['script_batches_per_s']:,.0f} vs bare "
        f"{bare_digits['script_batches_per_s']:,.0f} batches/s",
    ]
    return report
