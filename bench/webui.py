"""The web UI at scale: an experiment of 1,000 trials x 1,000 validation points per trial.

The log holds the experiment and its 1,000 ``TrialRequested`` facts, projected by the tracker;
the 2,000,000 metric rows (validation and training, 1,000 steps each) are inserted straight into
the tracker's ``tr_metrics`` table, because what is measured is the read path, not ingest
(``bench/ingest.py`` measures that). Then all trials but :data:`LIVE` end (``TrialStateChanged``
COMPLETED in the log, projected by the tracker, which rolls up their chart buckets as it does
live); the live ones get the buckets the tracker keeps while a trial runs, computed by the same
function (``series.roll_up``: what ``series.keep_buckets`` keeps equal, as its tests show, since
the rows were copied past the projection). The API runs as its own process.

A second experiment of the same size has all its trials running (none ended), with kept
buckets; its page is also opened once more with the buckets removed, which reads every trial
from its points as the chart did before buckets were kept for running trials.

Figures (as opens per second, so that higher is better; seconds are in the notes):

1. ``experiment page``: in headless Chromium (Debian's, driven by Playwright), from navigation
   to the experiment page until its learning-curve chart has drawn all 1,000 trials (the page's
   own ``performance.now()``), median of a few opens, beside the time the same data takes
   through the REST API alone: the experiment, then every trial's validation metrics
   (``GET /api/v1/trials/{id}/metrics?group=validation``, 8 requests at a time).
2. ``series endpoint``: the downsampled series request alone, beside the same REST baseline.
3. ``experiment page, 1,000 running trials``: the page of the all-running experiment, against a
   target of under a second, beside the same page read from the points (no kept buckets).
4. ``series endpoint, running trials``: its series request alone, beside the same from points.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import asyncpg

from bench.common import BenchContext, Measure, Report, progress
from cairn.local.servers import free_port
from events.domain.config import parse_config
from events.domain.names import trial_stream
from events.domain.types import ExperimentSubmitted, TrialRequested, TrialStateChanged
from events.log.store import EventStore
from services.api import tables
from services.tracker import schema as tracker_schema
from services.tracker import series as tracker_series
from services.tracker.service import catch_up

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CONFIG = """
name: webui-scale
entrypoint: python3 train.py
searcher: {name: random, metric: validation_loss, max_trials: 1000, max_length: {batches: 1000}}
hyperparameters:
  lr: {type: log, base: 10, minval: -4, maxval: -1}
  width: {type: int, minval: 16, maxval: 256}
"""
OPENS = 3
ADMIN_PASSWORD = "bench-admin-password"
"""The initial admin's password of the benchmark's own gateway."""
LIVE = 16
"""Trials still running when the page opens (a search runs a few at a time)."""
RAW_OPENS = 2
"""Opens of the all-running page read from the points (slow: fewer of them)."""


class FineMeasure(Measure):
    """Printed with two decimals."""

    decimals = 2


async def _load(dsn: str, trials: int, points: int, live: int) -> None:
    """The experiment and its trials through the log and the tracker; the metric rows copied;
    all trials but the last ``live`` ended through the log; the live ones' buckets kept."""
    store = await EventStore.connect(dsn)
    try:
        await tables.migrate(store)
        await tracker_schema.migrate(store)
        config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
        await store.append(
            "experiment-1", [ExperimentSubmitted(experiment_id=1, config=config, owner="admin")]
        )
        requested = [
            TrialRequested(
                experiment_id=1,
                trial_id=i,
                seq=i,
                request_id=f"r{i}",
                hparams={"lr": 10 ** (-4 + 3 * i / trials), "width": 16 + (i * 37) % 240},
                trial_seed=i,
            )
            for i in range(1, trials + 1)
        ]
        for start in range(0, trials, 200):
            await store.append(
                "experiment-1", requested[start : start + 200], expected_version=None
            )
        await catch_up(store)
    finally:
        await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        # Curves that fall at 17 different rates, with a little noise, in both groups.
        await conn.execute(
            """INSERT INTO tr_metrics (trial_id, experiment_id, run_id, "group", steps_completed,
                                       metrics, archived, reported_at)
               SELECT t, 1, 1, g, s,
                      jsonb_build_object(CASE WHEN g = 'validation' THEN 'validation_loss'
                                              ELSE 'loss' END,
                                         2.0 / (1.0 + (0.002 + 0.01 * (t % 17) / 17.0) * s)
                                         + 0.02 * ((s * t) % 7) / 7.0),
                      false, now()
               FROM generate_series(1, $1::int) t, generate_series(1, $2::int) s,
                    unnest(ARRAY['validation', 'training']) g""",
            trials,
            points,
        )
        await conn.execute(
            """UPDATE tr_trials t SET best_metric = m.best, steps_completed = $1
               FROM (SELECT trial_id, min((metrics->>'validation_loss')::float8) AS best
                     FROM tr_metrics WHERE "group" = 'validation' GROUP BY trial_id) m
               WHERE m.trial_id = t.trial_id""",
            points,
        )
    finally:
        await conn.close()
    store = await EventStore.connect(dsn)
    try:
        for trial_id in range(1, trials - live + 1):
            await store.append(
                trial_stream(trial_id), [TrialStateChanged(trial_id=trial_id, state="COMPLETED")]
            )
        await catch_up(store)
        # The copied rows bypassed the projection, which keeps a running trial's buckets equal
        # to roll_up of its points: the same function gives them.
        async with store.transaction() as tx:
            for trial_id in range(trials - live + 1, trials + 1):
                await tracker_series.roll_up(tx.conn, trial_id)
        await store.execute("ANALYZE tr_metrics; ANALYZE tr_trials; ANALYZE tr_series_rollups")
    finally:
        await store.close()


async def _rest_baseline(url: str, token: str, trials: int) -> float:
    """Seconds to read the experiment and every trial's validation metrics, 8 at a time."""
    headers = {"Authorization": f"Bearer {token}"}
    started = time.perf_counter()
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.get(f"{url}/api/v1/experiments/1") as resp:
            assert resp.status == 200, resp.status
            await resp.json()
        gate = asyncio.Semaphore(8)

        async def one(i: int) -> int:
            async with gate, http.get(f"{url}/api/v1/trials/{i}/metrics?group=validation") as r:
                body = await r.json()
                return len(body["metrics"])

        counts = await asyncio.gather(*(one(i) for i in range(1, trials + 1)))
    assert sum(counts) > 0
    return time.perf_counter() - started


async def _series_seconds(url: str, token: str) -> float:
    headers = {"Authorization": f"Bearer {token}"}
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        http.get(f"{url}/api/v1/experiments/1/series?group=validation&buckets=400") as resp,
    ):
        assert resp.status == 200, resp.status
        await resp.json()
    return time.perf_counter() - started


async def _browser_opens(url: str, token: str, trials: int, opens: int = OPENS) -> list[float]:
    """Seconds from navigation to the drawn learning curves, as the page measures them."""
    from playwright.async_api import async_playwright

    seconds = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await (await browser.new_context(viewport={"width": 1400, "height": 900})).new_page()
        await page.goto(f"{url}/#/login")
        await page.evaluate(
            "([t]) => { localStorage.setItem('cairn.token', t);"
            " localStorage.setItem('cairn.user', JSON.stringify({username: 'admin', admin: true})); }",
            [token],
        )
        for _ in range(opens):
            await page.goto("about:blank")
            await page.goto(f"{url}/#/experiments/1")
            await page.wait_for_function(
                f"""() => {{ const el = document.querySelector('#learning-curves');
                           return el && el.dataset.series === '{trials}' && el.dataset.drawn; }}""",
                timeout=120_000,
            )
            seconds.append(await page.evaluate("performance.now()") / 1000.0)
        await browser.close()
    return seconds


@asynccontextmanager
async def _api(ctx: BenchContext, dsn: str, name: str) -> AsyncIterator[tuple[str, str]]:
    """The API as its own process on ``dsn``; yields its URL and an admin token."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_DB": dsn,
        "CAIRN_NATS": "",
        "CAIRN_ADMIN_PASSWORD": ADMIN_PASSWORD,
    }
    log = open(ctx.tmp / f"{name}-api.log", "wb")  # noqa: SIM115 - closed in finally
    api = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, "-m", "services.api", "--db", dsn, "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        yield url, await _login(url)
    finally:
        os.killpg(api.pid, signal.SIGKILL)
        await asyncio.to_thread(api.wait)
        log.close()


async def _running(
    ctx: BenchContext, trials: int, points: int
) -> tuple[list[float], list[float], list[float], list[float]]:
    """The all-running experiment: page opens and series requests with kept buckets, then the
    same read from the points (buckets removed)."""
    dsn = await ctx.create_database("webui_running")
    progress(f"webui: loading {trials} running trials x {points} points")
    await _load(dsn, trials, points, trials)
    async with _api(ctx, dsn, "webui-running") as (url, token):
        await _series_seconds(url, token)  # warm the database's caches
        series = [await _series_seconds(url, token) for _ in range(OPENS)]
        opens = await _browser_opens(url, token, trials)
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("DELETE FROM tr_series_rollups; ANALYZE tr_series_rollups")
        finally:
            await conn.close()
        progress("webui: the running trials read from their points (no kept buckets)")
        await _series_seconds(url, token)
        raw_series = [await _series_seconds(url, token) for _ in range(RAW_OPENS)]
        raw_opens = await _browser_opens(url, token, trials, RAW_OPENS)
    return opens, series, raw_opens, raw_series


async def run(ctx: BenchContext) -> Report:
    """Loads the experiments, starts the API, and times the pages and the REST baseline."""
    trials = ctx.scaled(1000, 10)
    points = ctx.scaled(1000, 10)
    if not await asyncio.to_thread(Path(CHROMIUM).exists):
        raise RuntimeError(f"{CHROMIUM} is missing: `make browser` installs it")
    dsn = await ctx.create_database("webui")
    live = min(LIVE, trials // 2)
    progress(f"webui: loading {trials} trials x {points} points ({live} live)")
    await _load(dsn, trials, points, live)
    async with _api(ctx, dsn, "webui") as (url, token):
        await _series_seconds(url, token)  # warm the database's caches
        rest = [await _rest_baseline(url, token, trials) for _ in range(2)]
        series = [await _series_seconds(url, token) for _ in range(OPENS)]
        opens = await _browser_opens(url, token, trials)
    run_opens, run_series, raw_opens, raw_series = await _running(ctx, trials, points)
    page_s, rest_s, series_s = statistics.median(opens), min(rest), statistics.median(series)
    run_page_s, run_series_s = statistics.median(run_opens), statistics.median(run_series)
    raw_page_s, raw_series_s = statistics.median(raw_opens), statistics.median(raw_series)
    label = f"REST alone ({trials + 1} requests, {rest_s:.2f}s)"
    raw_label = "read from the points, no kept buckets"
    return Report(
        measures=[
            FineMeasure(
                f"experiment page opens/s ({trials}x{points})",
                1.0 / page_s,
                1.0 / rest_s,
                label,
                unit="opens/s",
                count=len(opens),
                notes=f"navigation to drawn curves {page_s:.2f}s (median of {len(opens)})",
            ),
            FineMeasure(
                "downsampled series request/s",
                1.0 / series_s,
                1.0 / rest_s,
                label,
                unit="requests/s",
                count=len(series),
                notes=f"{series_s:.2f}s",
            ),
            FineMeasure(
                f"experiment page, {trials:,} running trials ({trials}x{points})",
                1.0 / run_page_s,
                1.0 / raw_page_s,
                f"{raw_label} ({raw_page_s:.2f}s)",
                unit="opens/s",
                count=len(run_opens),
                notes=f"navigation to drawn curves {run_page_s:.2f}s (median of {len(run_opens)})",
                target="< 1 s",
                met=run_page_s < 1.0,
            ),
            FineMeasure(
                "downsampled series request/s, running trials",
                1.0 / run_series_s,
                1.0 / raw_series_s,
                f"{raw_label} ({raw_series_s:.2f}s)",
                unit="requests/s",
                count=len(run_series),
                notes=f"{run_series_s:.2f}s",
                target="< 1 s",
                met=run_series_s < 1.0,
            ),
        ],
        details={
            "page_seconds": opens,
            "rest_seconds": rest,
            "series_seconds": series,
            "running_page_seconds": run_opens,
            "running_series_seconds": run_series,
            "running_page_seconds_from_points": raw_opens,
            "running_series_seconds_from_points": raw_series,
        },
        notes=[
            f"experiment page: {page_s:.2f}s from navigation to {trials} drawn curves; "
            f"the same points through the REST API alone: {rest_s:.2f}s",
            f"experiment page, {trials} running trials: {run_page_s:.2f}s with kept buckets, "
            f"{raw_page_s:.2f}s read from the points (target < 1 s)",
        ],
    )


async def _login(url: str) -> str:
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.post(
                    f"{url}/api/v1/auth/login",
                    json={"username": "admin", "password": ADMIN_PASSWORD},
                ) as resp:
                    if resp.status == 200:
                        return str((await resp.json())["token"])
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the API did not start")
            await asyncio.sleep(0.2)
