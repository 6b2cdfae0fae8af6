"""Metric ingest: points per second through the API, beside an MLflow tracking server.

cairn: a real ``python -m services.api`` process on a fresh database of the bench's PostgreSQL
(durable unless ``--fast``), one trial appended to the log as the searcher and scheduler would,
and N training points (4 scalar metrics each) sent by ``cairn.core``'s own
:class:`~cairn.core._reporter.HTTPReporter` with the trial's token: it posts batches of
``MAX_BATCH`` (500) items to ``POST /api/v1/trials/{trial_id}/reports`` back to back, one request
at a time, as a training loop that reports faster than the network would. Timed from the first
``submit`` until everything is acknowledged; each point must then be a ``WorkloadCompleted`` event
in the trial's stream. When
the tracker is present (``services.tracker.service``) its projection is then brought to the head
of the log and timed until ``tr_metrics`` holds every point (catch-up), and N more points are
sent with the tracker's consumers running, timed from the first submit until ``tr_metrics``
holds them all (end-to-end: ingested and queryable).

MLflow (``requirements-bench.txt``): ``mlflow server`` with a SQLite backend store in the bench's
scratch directory and one worker (the client sends one request at a time, as cairn's does), the
same N points logged with ``MlflowClient.log_batch`` (at most 1000 metrics per call, MLflow's
limit: 250 points of 4 metrics) and, as a second baseline, a smaller sample with one
``log_metric`` call per metric value.

A point is one step's 4 metrics in both systems; ratios are cairn / MLflow (higher is better).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Measure, Report, per_second, progress
from cairn.core._http import Session
from cairn.core._reporter import MAX_BATCH, HTTPReporter
from events.domain.config import parse_config
from events.domain.names import allocation_id, trial_stream
from events.domain.types import ExperimentSubmitted, SlotsAllocated, TrialRequested
from events.log.store import EventStore
from services.api.auth import trial_token

ROOT = Path(__file__).resolve().parent.parent
POINTS = 20_000
PER_CALL_POINTS = 500
METRICS_PER_POINT = 4
MLFLOW_BATCH_METRICS = 1000
"""MLflow's limit on metrics per ``log_batch`` call."""
WARMUP_POINTS = 500
TRIAL_ID = 1
WARMUP_TRIAL_ID = 2
LIVE_TRIAL_ID = 3
"""The trial reported while a live tracker projects (the end-to-end figure)."""
LIVE_CATCH_UP_EVERY = 0.05
"""Seconds between the live tracker's catch-ups (it has no bus here to wake it)."""
CONFIG = """
name: ingest-bench
entrypoint: python train.py
searcher: {name: grid, metric: loss, max_length: {batches: 100000}}
hyperparameters: {lr: 0.1}
checkpoint_storage: {type: shared_fs, host_path: /tmp/cairn-bench-ckpts}
"""
_MLFLOW_ENV = {
    "MLFLOW_ENABLE_TELEMETRY": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "120",
}


def _free_port() -> int:
    """A free loopback TCP port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _metrics(step: int) -> dict[str, float]:
    """The 4 scalar metrics of one training step (deterministic, distinct per step)."""
    return {
        "loss": 1.0 / (1 + step),
        "accuracy": step / (step + 100.0),
        "lr": 0.1 * 0.999**step,
        "grad_norm": 1.0 + (step % 17) / 17,
    }


def _stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERMs ``proc`` (and its process group), SIGKILLing it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, 9)
        proc.wait(5)


def _tail(log: Path, chars: int = 5000) -> str:
    """The last ``chars`` characters of a process's log (for error messages)."""
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def _spawn(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Starts ``argv`` in its own process group with stdout and stderr appended to ``log``."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def _cairn_env(dsn: str, ready: Path, **more: str) -> dict[str, str]:
    """The environment of a cairn process this bench starts: this checkout importable, no fault
    points, ``ready`` touched once it serves, its database ``dsn`` (it carries the password: kept
    off the command line), and the variables ``more``."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_FAULTS": "",
        "CAIRN_READY_FILE": str(ready),
        "CAIRN_DB": dsn,
        **more,
    }


async def _wait_for(
    check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float
) -> None:
    """Polls ``check`` until true; fails with ``log``'s tail if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (exit {proc.poll()}):\n{_tail(log)}")
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------------------------
# cairn


async def _seed(store: EventStore) -> None:
    """Experiment 1 with trials 1 and 2, each allocated: what the searcher and scheduler
    would have appended before the training code starts reporting."""
    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=config)])
    for trial_id in (TRIAL_ID, WARMUP_TRIAL_ID, LIVE_TRIAL_ID):
        await store.append(
            "experiment-1",
            [
                TrialRequested(
                    experiment_id=1,
                    trial_id=trial_id,
                    seq=trial_id,
                    request_id=f"r-{trial_id}",
                    hparams={"lr": 0.1},
                    trial_seed=42,
                )
            ],
        )
        await store.append(
            trial_stream(trial_id),
            [
                SlotsAllocated(
                    trial_id=trial_id,
                    allocation_id=allocation_id(trial_id, 1),
                    placements={"bench": ["0"]},
                    run_id=1,
                )
            ],
        )


def _report_points(url: str, token: str, trial_id: int, n: int) -> float:
    """Sends ``n`` training points through ``cairn.core``'s reporter; returns the seconds from
    the first submit until all are acknowledged."""
    alloc = allocation_id(trial_id, 1)
    reporter = HTTPReporter(Session(url, token), trial_id, alloc, max_batch=MAX_BATCH)
    t0 = time.perf_counter()
    for step in range(1, n + 1):
        reporter.submit(
            {
                "kind": "metrics",
                "group": "training",
                "steps_completed": step,
                "metrics": _metrics(step),
                "run_id": 1,
            }
        )
    delivered = reporter.flush(timeout=1800)
    seconds = time.perf_counter() - t0
    reporter.close(timeout=30)
    if not delivered or reporter.dropped or reporter.delivered != n:
        raise RuntimeError(
            f"reporter delivered {reporter.delivered} of {n} points ({reporter.dropped} dropped)"
        )
    return seconds


def _tracker_hook(name: str) -> Callable[..., Awaitable[None]] | None:
    """``services.tracker.service.<name>`` when the tracker is present, else ``None``."""
    try:
        module = importlib.import_module("services.tracker.service")
    except ImportError:
        return None
    hook = getattr(module, name, None)
    return hook if callable(hook) else None


async def _projected(store: EventStore, trial_id: int, n: int) -> bool:
    """Whether ``tr_metrics`` holds all ``n`` training points of ``trial_id``.

    The tracker projects the log in order and commits each page's rows at once, so the count
    cannot reach ``n`` before the row of the last step is there: until it is, one key lookup
    answers (a count every poll would read the growing table over and over, taking the
    machine from the processes being measured); then the count confirms it.
    """
    last = await store.fetchval(
        """SELECT true FROM tr_metrics
           WHERE trial_id = $1 AND run_id = 1 AND "group" = 'training' AND steps_completed = $2""",
        trial_id,
        n,
    )
    if not last:
        return False
    count = await store.fetchval("SELECT count(*) FROM tr_metrics WHERE trial_id = $1", trial_id)
    return bool(count >= n)


async def _live(store: EventStore, dsn: str, url: str, n: int, work: Path) -> float:
    """Seconds from the first submit of ``n`` points until ``tr_metrics`` holds them all, with
    the tracker's consumers running meanwhile in a process of their own, as in a deployment
    (``python -m bench.ingest --tracker``: catch-ups every ``LIVE_CATCH_UP_EVERY`` seconds,
    as bus wake-ups would trigger them)."""
    ready, log = work / "tracker.ready", work / "tracker.log"
    env = _cairn_env(dsn, ready, CAIRN_CHECKPOINT_ROOT=str(work / "checkpoints"))
    proc = _spawn([sys.executable, "-m", "bench.ingest", "--tracker"], log, env)
    try:
        await _wait_for(ready.exists, proc, "the tracker", log, timeout=60)
        token = await trial_token(store, LIVE_TRIAL_ID, 1)
        t0 = time.perf_counter()
        await asyncio.to_thread(_report_points, url, token, LIVE_TRIAL_ID, n)
        while True:
            if await _projected(store, LIVE_TRIAL_ID, n):
                return time.perf_counter() - t0
            if proc.poll() is not None:
                raise RuntimeError(f"the tracker exited ({proc.poll()}):\n{_tail(log)}")
            await asyncio.sleep(0.01)
    finally:
        await asyncio.to_thread(_stop, proc)


async def _tracker_main() -> None:
    """The live tracker of :func:`_live`: every consumer of ``services.tracker`` on
    ``$CAIRN_DB``, woken by a fast timer instead of the bus, until SIGTERM."""
    import signal

    from services.tracker import schema
    from services.tracker.service import run_consumers

    store = await EventStore.connect(os.environ["CAIRN_DB"], max_size=4)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await schema.migrate(store)
        await asyncio.to_thread(Path(os.environ["CAIRN_READY_FILE"]).touch)
        await run_consumers(
            store,
            None,
            stop,
            checkpoint_root=Path(os.environ["CAIRN_CHECKPOINT_ROOT"]),
            catch_up_every=LIVE_CATCH_UP_EVERY,
        )
    finally:
        await store.close()


async def _cairn(ctx: BenchContext, n: int, work: Path, report: Report) -> dict[str, Any]:
    """Runs the cairn side; returns its figures."""
    dsn = await ctx.create_database("bench_ingest")
    port = _free_port()
    ready, log = work / "api.ready", work / "api.log"
    env = _cairn_env(dsn, ready)
    proc = _spawn([sys.executable, "-m", "services.api", "--port", str(port)], log, env)
    store: EventStore | None = None
    figures: dict[str, Any] = {}
    try:
        await _wait_for(ready.exists, proc, "the API", log, timeout=60)
        store = await EventStore.connect(dsn, max_size=6)
        await _seed(store)
        url = f"http://127.0.0.1:{port}"
        warmup_token = await trial_token(store, WARMUP_TRIAL_ID, 1)
        await asyncio.to_thread(_report_points, url, warmup_token, WARMUP_TRIAL_ID, WARMUP_POINTS)
        progress(f"ingest: cairn, {n:,} points through the API in batches of {MAX_BATCH}")
        seconds = await asyncio.to_thread(
            _report_points, url, await trial_token(store, TRIAL_ID, 1), TRIAL_ID, n
        )
        events = await store.fetchval(
            "SELECT count(*) FROM events WHERE stream_id = $1 AND type = 'WorkloadCompleted'",
            trial_stream(TRIAL_ID),
        )
        if events != n:
            raise RuntimeError(f"the log holds {events} WorkloadCompleted of the {n} points")
        figures = {
            "points": n,
            "seconds": round(seconds, 3),
            "points_per_s": per_second(n, seconds),
            "workload_completed_events": events,
            "batch": MAX_BATCH,
        }
        progress(f"  {figures['points_per_s']:,.0f} points/s ({seconds:.2f}s)")

        catch_up = _tracker_hook("catch_up")
        if catch_up is None:
            report.notes.append("tracker projection not measured: services.tracker absent")
        else:
            progress("ingest: tracker projection catch-up over the log")
            t0 = time.perf_counter()
            await catch_up(store, checkpoint_root=work / "checkpoints")
            projection_s = time.perf_counter() - t0
            projected = await store.fetchval(
                "SELECT count(*) FROM tr_metrics WHERE trial_id = $1", TRIAL_ID
            )
            if projected != n:
                raise RuntimeError(f"tr_metrics holds {projected} of the {n} points")
            figures["projection_seconds"] = round(projection_s, 3)
            figures["projection_points_per_s"] = per_second(n + WARMUP_POINTS, projection_s)
            progress(
                f"  projected in {projection_s:.2f}s "
                f"({figures['projection_points_per_s']:,.0f} points/s incl. the warm-up trial)"
            )
            progress(f"ingest: {n:,} points through the API with the tracker projecting live")
            live_s = await _live(store, dsn, url, n, work)
            figures["live_seconds"] = round(live_s, 3)
            figures["ingest_and_projection_points_per_s"] = per_second(n, live_s)
            progress(f"  queryable in {live_s:.2f}s ({per_second(n, live_s):,.0f} points/s)")
    except BaseException:
        print(_tail(log), flush=True)
        raise
    finally:
        if store is not None:
            await store.close()
        await asyncio.to_thread(_stop, proc)
    return figures


# --------------------------------------------------------------------------------------------
# MLflow


def _mlflow_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _mlflow_log(url: str, n: int, per_call: int) -> dict[str, Any]:
    """Logs ``n`` points with ``log_batch`` and ``per_call`` points with ``log_metric``."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=url)
    experiment_id = client.create_experiment("ingest-bench")
    names = list(_metrics(0))
    per_batch = MLFLOW_BATCH_METRICS // METRICS_PER_POINT

    def batch(run_id: str, first: int, last: int) -> None:
        now = int(time.time() * 1000)
        for start in range(first, last + 1, per_batch):
            metrics = [
                Metric(key, value, now, step)
                for step in range(start, min(start + per_batch, last + 1))
                for key, value in _metrics(step).items()
            ]
            client.log_batch(run_id, metrics=metrics)

    warmup = client.create_run(experiment_id).info.run_id
    batch(warmup, 1, WARMUP_POINTS)
    for step in range(1, 11):
        client.log_metric(warmup, "loss", 1.0, step=step)

    run_id = client.create_run(experiment_id).info.run_id
    progress(f"ingest: MLflow log_batch, {n:,} points ({per_batch} per call)")
    t0 = time.perf_counter()
    batch(run_id, 1, n)
    batch_s = time.perf_counter() - t0
    history = client.get_metric_history(run_id, names[0])
    if len(history) != n:
        raise RuntimeError(f"MLflow holds {len(history)} of the {n} {names[0]} values")
    progress(f"  {per_second(n, batch_s):,.0f} points/s ({batch_s:.2f}s)")

    progress(f"ingest: MLflow log_metric, {per_call:,} points ({per_call * len(names):,} calls)")
    single = client.create_run(experiment_id).info.run_id
    t0 = time.perf_counter()
    for step in range(1, per_call + 1):
        for key, value in _metrics(step).items():
            client.log_metric(single, key, value, step=step)
    call_s = time.perf_counter() - t0
    progress(f"  {per_second(per_call, call_s):,.0f} points/s ({call_s:.2f}s)")
    return {
        "log_batch": {
            "points": n,
            "seconds": round(batch_s, 3),
            "points_per_s": per_second(n, batch_s),
            "metrics_per_call": per_batch * len(names),
        },
        "log_metric": {
            "points": per_call,
            "calls": per_call * len(names),
            "seconds": round(call_s, 3),
            "points_per_s": per_second(per_call, call_s),
        },
    }


async def _mlflow(n: int, per_call: int, work: Path) -> dict[str, Any]:
    """Starts an MLflow tracking server on SQLite, logs through it, stops it."""
    if shutil.which("mlflow", path=str(Path(sys.executable).parent)) is None:
        raise RuntimeError("mlflow is not installed: pip install -r requirements-bench.txt")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / "mlflow.log"
    env = {**os.environ, **_MLFLOW_ENV}
    os.environ.update(_MLFLOW_ENV)
    argv = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{work / 'mlflow.db'}",
        "--default-artifact-root",
        str(work / "mlflow-artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    progress("ingest: starting the MLflow tracking server (SQLite backend store, 1 worker)")
    proc = _spawn(argv, log, env)
    try:
        await _wait_for(lambda: _mlflow_up(url), proc, "the MLflow server", log, timeout=180)
        return await asyncio.to_thread(_mlflow_log, url, n, per_call)
    except BaseException:
        print(_tail(log), flush=True)
        raise
    finally:
        await asyncio.to_thread(_stop, proc)


# --------------------------------------------------------------------------------------------


async def run(ctx: BenchContext) -> Report:
    """Measures cairn's metric ingest and MLflow's on the same points; returns the figures."""
    report = Report()
    n = ctx.scaled(POINTS, minimum=MAX_BATCH)
    per_call = ctx.scaled(PER_CALL_POINTS, minimum=50)
    work = ctx.tmp / "ingest"
    work.mkdir(parents=True, exist_ok=True)

    cairn = await _cairn(ctx, n, work, report)
    mlflow = await _mlflow(n, per_call, work)
    report.details = {"cairn": cairn, "mlflow": mlflow, "metrics_per_point": METRICS_PER_POINT}

    rate = cairn["points_per_s"]
    report.measures += [
        Measure(
            f"metric points via API, batches of {MAX_BATCH} (points/s)",
            rate,
            mlflow["log_batch"]["points_per_s"],
            "MLflow log_batch, 1000 metrics/call",
            unit="points/s",
            count=n,
            notes="cairn.core HTTPReporter -> POST /trials/{id}/reports; MLflow on SQLite",
        ),
        Measure(
            "metric points via API vs per-call logging (points/s)",
            rate,
            mlflow["log_metric"]["points_per_s"],
            "MLflow log_metric, 1 call/metric",
            unit="points/s",
            count=n,
            notes=f"MLflow sample: {per_call} points ({per_call * METRICS_PER_POINT} calls)",
        ),
    ]
    if "projection_points_per_s" in cairn:
        report.measures += [
            Measure(
                "tracker projection catch-up (points/s)",
                cairn["projection_points_per_s"],
                None,
                "",
                unit="points/s",
                count=n + WARMUP_POINTS,
                notes="services.tracker.service.catch_up after the ingest, to tr_metrics",
            ),
            Measure(
                "end-to-end: ingested and queryable (points/s)",
                cairn["ingest_and_projection_points_per_s"],
                mlflow["log_batch"]["points_per_s"],
                "MLflow log_batch (queryable at once)",
                unit="points/s",
                count=n,
                notes="cairn: first submit until tr_metrics holds every point, tracker live",
            ),
        ]
    report.notes += [
        f"a point is one step's {METRICS_PER_POINT} scalar metrics; both clients send one "
        "request at a time",
        "cairn writes to PostgreSQL"
        + (" (durable)" if ctx.durable else " (fsync off)")
        + "; MLflow to SQLite in the scratch directory (default synchronous mode)",
    ]
    return report


if __name__ == "__main__" and sys.argv[1:] == ["--tracker"]:
    asyncio.run(_tracker_main())
