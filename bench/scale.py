"""A year of a busy lab's log: cold starts, the tracker's rebuild and the API under load.

``python -m bench scale`` (opt-in: not part of the default ``make bench`` run). Sizes:
``CAIRN_BENCH_SCALE_EVENTS`` (default 10,000,000; times ``--scale``) events shaped by
:mod:`bench._scale_log` (about 475 events an experiment of 10 trials: 10M events are about 21k
experiments and 210k trials), ``CAIRN_BENCH_SCALE_SECONDS`` (default 10) seconds of load per route.

1. The log is COPYed into a fresh database (migrated first, as ``cairn up`` does), then every
   consumer's checkpoint is put at the head, as a cluster that ran for the year has them.
2. The tracker's full rebuild (``python -m services.tracker --rebuild``: empty projections to the
   head), timed as a process.
3. Each service is started cold, one after the other (relay, searcher, scheduler, tracker, API),
   with a nats-server of its own; "ready" is its ``/readyz`` answering 200 (it announced itself
   ready and its consumers are within ``CAIRN_READY_MAX_LAG`` of the head). Its resident memory
   (``VmRSS`` and peak ``VmHWM`` from ``/proc``) is read once all are ready, and again after the
   load for the API.
4. The API's common routes are loaded by :data:`CLIENTS` concurrent closed-loop clients (an
   aiohttp load generator in this process: no load tool such as wrk or k6 is installed here, and
   the generator shares the CPUs with the server) for a bounded time each; p50/p99 and
   requests/s per route.
5. The ``?at=`` timestamp lookup (a bisection over positions) at moments over the year, beside
   the backward scan it replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench._scale_log import COLUMNS, Plan, generate
from bench.common import BenchContext, Measure, Report, progress
from cairn.local.processes import ProcessCluster
from cairn.local.servers import LOOPBACK, ServerProcess, free_port, start_nats
from events.log.relay import CHECKPOINT as RELAY_CHECKPOINT
from events.log.store import EventStore
from services.tracker import audit, gc, projections, usage, webhooks

EVENTS = int(os.environ.get("CAIRN_BENCH_SCALE_EVENTS", "10000000"))
ROUTE_SECONDS = float(os.environ.get("CAIRN_BENCH_SCALE_SECONDS", "10"))
CLIENTS = 50
READY_TARGET_S = 10.0
P99_TARGET_MS = 100.0
RSS_TARGET_MIB = 512
REBUILD_TARGET = 10_000_000 / 600
"""Events/s of a tracker rebuild that does 10M events in 10 minutes ("minutes, not an hour")."""
READY_TIMEOUT = 1800.0
DATABASE = "bench_scale"
SERVICES = ("relay", "searcher", "scheduler", "tracker", "api")
CONSUMERS = (
    RELAY_CHECKPOINT,
    "searcher",
    "scheduler",
    projections.NAME,
    gc.NAME,
    audit.NAME,
    usage.NAME,
    webhooks.NAME,
)
"""Every consumer the services run (their checkpoints are put at the head after the load)."""
POSITION_AT = """SELECT position FROM events WHERE recorded_at <= $1
                 ORDER BY position DESC LIMIT 1"""
"""The backward scan ``?at=<timestamp>`` used before :meth:`events.log.store.EventStore.position_at`
bisected positions (the baseline of the lookup's figure)."""
AT_LOOKUP_TARGET_MS = 10.0


class FineMeasure(Measure):
    """A measure printed with two decimals."""

    decimals = 2


# --------------------------------------------------------------------------------------------
# 1. the log


async def _load(dsn: str, plan: Plan) -> dict[str, Any]:
    """COPYs the generated log into ``events``; returns its facts."""
    conn = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        loaded, next_report = 0, 0
        for chunk in generate(plan):
            await conn.copy_records_to_table("events", columns=COLUMNS, records=chunk)
            loaded += len(chunk)
            if loaded >= next_report:
                rate = loaded / max(1e-9, time.perf_counter() - started)
                progress(f"  loaded {loaded:,} events ({rate:,.0f}/s)")
                next_report += max(100_000, plan.events // 20)
        copy_s = time.perf_counter() - started
        progress(f"  {loaded:,} events in {copy_s:.0f}s; ANALYZE")
        await conn.execute("ANALYZE events")
        head = int(await conn.fetchval("SELECT max(position) FROM events"))
        await conn.execute("SELECT setval('experiment_ids', $1)", plan.experiments + 1)
        await conn.execute(
            "SELECT setval('trial_ids', (SELECT count(*) FROM events WHERE type = 'TrialRequested'))"
        )
        size = await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('events'))")
        first, last = await conn.fetchrow("SELECT min(recorded_at), max(recorded_at) FROM events")
        types = {
            r["type"]: r["n"]
            for r in await conn.fetch(
                "SELECT type, count(*) AS n FROM events GROUP BY 1 ORDER BY 2"
            )
        }
        return {
            "events": loaded,
            "head": head,
            "experiments": plan.experiments,
            "trials": types.get("TrialRequested", 0),
            "copy_seconds": round(copy_s, 1),
            "table_size": size,
            "first_recorded_at": first.isoformat(),
            "last_recorded_at": last.isoformat(),
            "types": types,
        }
    finally:
        await conn.close()


async def _checkpoints_at_head(dsn: str, names: Sequence[str]) -> int:
    """Puts each consumer's checkpoint at the log's head; returns the head."""
    conn = await asyncpg.connect(dsn)
    try:
        head = int(await conn.fetchval("SELECT max(position) FROM events"))
        await conn.executemany(
            """INSERT INTO checkpoints (name, position) VALUES ($1, $2)
               ON CONFLICT (name) DO UPDATE SET position = excluded.position""",
            [(name, head) for name in names],
        )
        return head
    finally:
        await conn.close()


# --------------------------------------------------------------------------------------------
# 2-3. the services


def _memory(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in MiB (empty if it is gone)."""
    found: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
    return found


@dataclass
class _Started:
    """A service started cold: when, where its ``/readyz`` is, and how long it took."""

    name: str
    pid: int
    readyz: str
    ready_s: float = 0.0
    memory: dict[str, float] = field(default_factory=dict)


class _Cluster(ProcessCluster):
    """The services as processes; each started alone and timed to its ``/readyz``."""

    async def start_timed(self, name: str, http: aiohttp.ClientSession) -> _Started:
        """Starts ``name`` and waits until its ``/readyz`` answers 200."""
        if name == "api":
            args: tuple[str, ...] = ("--host", self.api_host, "--port", str(self.api_port))
            readyz = f"{self.api_url}/readyz"
        else:
            port = free_port()
            args = ("--metrics-address", f"{LOOPBACK}:{port}")
            readyz = f"http://{LOOPBACK}:{port}/readyz"
            if name == "tracker":
                args += ("--checkpoint-root", str(self.workdir / "checkpoints"))
        t0 = time.perf_counter()
        proc = await asyncio.to_thread(self.start, name, f"services.{name}", *args)
        started = _Started(name, proc.pid, readyz)
        last = ""
        while time.perf_counter() - t0 < READY_TIMEOUT:
            self.check_alive()
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with http.get(readyz, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        started.ready_s = time.perf_counter() - t0
                        return started
                    last = await resp.text()
            await asyncio.sleep(0.05)
        raise RuntimeError(f"{name} not ready in {READY_TIMEOUT:.0f}s: {last}\n{self.logs()}")

    async def rebuild_tracker(self) -> float:
        """Runs ``python -m services.tracker --rebuild`` to its end; returns its seconds."""
        t0 = time.perf_counter()
        proc = await asyncio.to_thread(
            self.start, "tracker-rebuild", "services.tracker", "--rebuild"
        )
        code = await asyncio.to_thread(proc.wait)
        seconds = time.perf_counter() - t0
        if code != 0:
            raise RuntimeError(f"tracker --rebuild exited {code}\n{self.logs()}")
        del self.procs["tracker-rebuild"]
        return seconds


@contextlib.asynccontextmanager
async def _cluster(ctx: BenchContext, work: Path) -> AsyncIterator[tuple[_Cluster, str]]:
    """A migrated database with roles, a nats-server, and a :class:`_Cluster` (nothing
    started); stops them on the way out (printing the logs if the body failed)."""
    nats: ServerProcess | None = None
    cluster: _Cluster | None = None
    try:
        dsn = await ctx.create_database(DATABASE)
        nats = await asyncio.to_thread(start_nats, work / "nats")
        cluster = _Cluster(dsn, nats.url, work)
        await asyncio.to_thread(cluster.prepare)
        yield cluster, dsn
    except BaseException:
        if cluster is not None:
            print(cluster.logs(), flush=True)
        raise
    finally:
        if cluster is not None:
            progress("scale: stopping the services")
            await asyncio.to_thread(cluster.stop)
        if nats is not None:
            await asyncio.to_thread(nats.stop)


# --------------------------------------------------------------------------------------------
# 4. load


@dataclass
class RouteResult:
    """Latencies of one route under load."""

    name: str
    latencies_ms: list[float]
    errors: int
    seconds: float
    statuses: dict[int, int]

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100) of the latencies, in ms."""
        if not self.latencies_ms:
            return None
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]

    @property
    def rate(self) -> float:
        """Successful requests per second."""
        return len(self.latencies_ms) / self.seconds if self.seconds else 0.0


PathFor = Callable[[random.Random], str]


async def _load_route(
    http: aiohttp.ClientSession, base: str, token: str, name: str, path_for: PathFor,
    seconds: float, *, clients: int = CLIENTS,
) -> RouteResult:  # fmt: skip
    """``clients`` closed-loop clients GET ``path_for(rng)`` for ``seconds``."""
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    deadline = time.perf_counter() + seconds

    async def client(k: int) -> None:
        nonlocal errors
        rng = random.Random(k)
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                async with http.get(base + path_for(rng), headers=headers) as resp:
                    await resp.read()
                    statuses[resp.status] = statuses.get(resp.status, 0) + 1
                    if resp.status == 200:
                        latencies.append(1000 * (time.perf_counter() - t0))
                    else:
                        errors += 1
            except (TimeoutError, aiohttp.ClientError):
                errors += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    return RouteResult(name, latencies, errors, time.perf_counter() - t0, statuses)


@dataclass(frozen=True)
class _Targets:
    """Ids and points of the loaded log the routes ask about."""

    experiments: int
    trials: int
    owners: list[str]
    projects: list[int]
    ends: list[tuple[int, int, datetime]]
    """(experiment id, position, recorded_at) of sampled experiments' COMPLETED."""
    first: datetime
    last: datetime


async def _targets(dsn: str, facts: dict[str, Any]) -> _Targets:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            """SELECT (payload->>'experiment_id')::bigint AS x, position, recorded_at
               FROM events WHERE type = 'ExperimentStateChanged'
                 AND payload->>'state' = 'COMPLETED'
               ORDER BY random() LIMIT 500"""
        )
        owners = [r["owner"] for r in await conn.fetch("SELECT DISTINCT owner FROM tr_experiments")]
        projects = [
            r["p"] for r in await conn.fetch("SELECT DISTINCT project_id AS p FROM tr_experiments")
        ]
    finally:
        await conn.close()
    return _Targets(
        experiments=facts["experiments"],
        trials=facts["trials"],
        owners=owners,
        projects=projects,
        ends=[(r["x"], r["position"], r["recorded_at"]) for r in rows],
        first=datetime.fromisoformat(facts["first_recorded_at"]),
        last=datetime.fromisoformat(facts["last_recorded_at"]),
    )


def _routes(t: _Targets) -> list[tuple[str, PathFor]]:
    """The common routes, each a function of a client's random generator."""

    def experiment(rng: random.Random) -> int:
        return rng.randint(1, t.experiments)

    def day(rng: random.Random) -> datetime:
        return t.first + (t.last - t.first) * rng.random()

    def usage(rng: random.Random) -> str:
        start = day(rng) - timedelta(days=30)
        return f"/api/v1/usage?from={start.date()}&to={(start + timedelta(days=30)).date()}&by=user"

    def at_time(rng: random.Random) -> str:
        x, _, when = rng.choice(t.ends)
        return f"/api/v1/experiments/{x}?at={when.isoformat().replace('+00:00', 'Z')}"

    def at_position(rng: random.Random) -> str:
        x, position, _ = rng.choice(t.ends)
        return f"/api/v1/experiments/{x}?at={position}"

    return [
        (
            "experiments list, owner+state",
            lambda r: f"/api/v1/experiments?owner={r.choice(t.owners)}&state=COMPLETED&limit=50",
        ),
        (
            "experiments list, project+name",
            lambda r: (
                f"/api/v1/experiments?project_id={r.choice(t.projects)}"
                f"&name=sweep-{r.randint(1, 9)}&limit=50"
            ),
        ),
        ("experiment page", lambda r: f"/api/v1/experiments/{experiment(r)}"),
        ("experiment trials", lambda r: f"/api/v1/experiments/{experiment(r)}/trials"),
        ("trial metrics", lambda r: f"/api/v1/trials/{r.randint(1, t.trials)}/metrics"),
        ("audit, by experiment", lambda r: f"/api/v1/audit?experiment_id={experiment(r)}"),
        ("audit, by actor", lambda r: f"/api/v1/audit?actor={r.choice(t.owners)}&limit=100"),
        ("usage, 30 days by user", usage),
        ("experiment ?at=position", at_position),
        ("experiment ?at=timestamp", at_time),
    ]


async def _login(http: aiohttp.ClientSession, cluster: _Cluster) -> str:
    body = {"username": "admin", "password": cluster.admin_password}
    async with http.post(f"{cluster.api_url}/api/v1/auth/login", json=body) as resp:
        data = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"login failed: {resp.status} {data}")
        return str(data["token"])


# --------------------------------------------------------------------------------------------
# 5. plans: the slow statements (auto_explain) and the ?at= timestamp lookup


SLOW_MS = 20
"""Statements slower than this are logged by the server (``log_min_duration_statement``)."""
_DURATION = re.compile(
    r"duration: ([0-9.]+) ms\s+(?:execute [^:]*|statement|parse [^:]*|bind [^:]*): (.*)", re.S
)
_PARAMETERS = re.compile(r"DETAIL:\s+[Pp]arameters: (.*)", re.S)
_PARAMETER = re.compile(r"\$(\d+) = ('(?:[^']|'')*'|NULL)")


async def _log_slow_statements(dsn: str, database: str) -> None:
    """Has every later session of ``database`` log its statements slower than :data:`SLOW_MS`
    with their parameters (the sessions already open are unaffected)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"ALTER DATABASE {database} SET log_min_duration_statement = {SLOW_MS}")
    finally:
        await conn.close()


def _records(log_text: str) -> list[str]:
    """The server log's records (a record's continuation lines start with whitespace)."""
    records: list[str] = []
    for line in log_text.splitlines():
        if line[:1].isspace() and records:
            records[-1] += "\n" + line
        else:
            records.append(line)
    return records


def slow_statements(log_text: str, top: int = 5) -> list[dict[str, Any]]:
    """The slow statements in the server's ``log_text``, grouped by query text, costliest
    (count x mean) first, each with its count, mean and max ms and one sample's parameters."""
    groups: dict[str, dict[str, Any]] = {}
    last: dict[str, Any] | None = None
    for record in _records(log_text):
        if (match := _DURATION.search(record)) is not None:
            ms, query = float(match.group(1)), " ".join(match.group(2).split())
            group = groups.setdefault(
                query,
                {"query": query, "count": 0, "total_ms": 0.0, "max_ms": 0.0, "parameters": None},
            )
            group["count"] += 1
            group["total_ms"] += ms
            group["max_ms"] = max(group["max_ms"], ms)
            last = group
        elif last is not None and (params := _PARAMETERS.search(record)) is not None:
            if last["parameters"] is None:
                last["parameters"] = dict(_PARAMETER.findall(params.group(1)))
            last = None
        else:
            last = None
    ordered = sorted(groups.values(), key=lambda g: -g["total_ms"])[:top]
    for group in ordered:
        group["mean_ms"] = round(group["total_ms"] / group["count"], 1)
        group["total_ms"] = round(group["total_ms"], 1)
    return ordered


def _with_literals(query: str, parameters: dict[str, str] | None) -> str:
    """``query`` with each ``$n`` replaced by the logged literal (highest numbers first)."""
    for number, literal in sorted((parameters or {}).items(), key=lambda kv: -int(kv[0])):
        query = query.replace(f"${number}", literal)
    return query


async def _explain(dsn: str, groups: list[dict[str, Any]]) -> None:
    """Adds to each slow statement its ``EXPLAIN ANALYZE`` plan and the scans in it."""
    conn = await asyncpg.connect(dsn)
    try:
        for group in groups:
            try:
                rows = await conn.fetch(
                    "EXPLAIN (ANALYZE, FORMAT TEXT) "
                    + _with_literals(group["query"], group["parameters"])
                )
            except asyncpg.PostgresError as exc:
                group["plan"], group["scans"] = [f"not explained: {exc}"], []
                continue
            plan = [str(r[0]) for r in rows]
            group["plan"] = plan[:20]
            group["scans"] = sorted(
                {
                    line.strip().removeprefix("->").strip().split("  (")[0]
                    for line in plan
                    if "Scan" in line
                }
            )
    finally:
        await conn.close()


async def _time_position_at(dsn: str, t: _Targets, samples: int = 24) -> dict[str, Any]:
    """``EventStore.position_at`` (the ``?at=<timestamp>`` lookup) at moments spread over the
    year, beside the backward scan it replaced (:data:`POSITION_AT`) on the same moments; both
    must name the same positions."""
    store = await EventStore.connect(dsn, max_size=1)
    conn = await asyncpg.connect(dsn)
    lookups: list[float] = []
    scans: list[float] = []
    mismatches = 0
    try:
        for i in range(1, samples + 1):
            moment = t.first + (t.last - t.first) * i / (samples + 1)
            started = time.perf_counter()
            found = await store.position_at(moment)
            lookups.append(1e3 * (time.perf_counter() - started))
            started = time.perf_counter()
            scanned = await conn.fetchval(POSITION_AT, moment)
            scans.append(1e3 * (time.perf_counter() - started))
            mismatches += found != int(scanned or 0)
    finally:
        await conn.close()
        await store.close()
    return {
        "samples": samples,
        "lookup_ms_median": statistics.median(lookups),
        "lookup_ms_max": max(lookups),
        "scan_ms_median": statistics.median(scans),
        "scan_ms_max": max(scans),
        "mismatches": mismatches,
    }


# --------------------------------------------------------------------------------------------


async def run(ctx: BenchContext) -> Report:
    """Loads the log, rebuilds the tracker, starts the services cold, loads the API."""
    report = Report()
    plan = Plan.for_events(ctx.scaled(EVENTS, minimum=10_000))
    seconds = max(2.0, ROUTE_SECONDS * min(1.0, ctx.scale))
    work = ctx.tmp / "scale"
    work.mkdir(parents=True, exist_ok=True)
    async with _cluster(ctx, work) as (cluster, dsn):
        progress(
            f"scale: generating and COPYing about {plan.events:,} events "
            f"({plan.experiments:,} experiments, {plan.trials:,} trials)"
        )
        facts = await _load(dsn, plan)
        report.details["log"] = facts

        progress("scale: tracker full rebuild (python -m services.tracker --rebuild)")
        rebuild_s = await cluster.rebuild_tracker()
        rebuild_rate = facts["events"] / rebuild_s
        progress(f"  {rebuild_s:.1f}s ({rebuild_rate:,.0f} events/s)")
        head = await _checkpoints_at_head(dsn, CONSUMERS)
        await _log_slow_statements(dsn, DATABASE)
        report.measures.append(
            Measure(
                f"tracker full rebuild, {facts['events']:,} events",
                rebuild_rate,
                None,
                "",
                count=facts["events"],
                target=f">= {REBUILD_TARGET:,.0f} events/s (10M in 10 min)",
                met=rebuild_rate >= REBUILD_TARGET,
                notes=f"{rebuild_s:.1f}s: projections, audit trail and usage from position 0",
            )
        )

        started: dict[str, _Started] = {}
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=CLIENTS + 10)
        ) as http:
            for name in SERVICES:
                progress(f"scale: cold start of {name}")
                one = await cluster.start_timed(name, http)
                progress(f"  ready in {one.ready_s:.2f}s")
                started[name] = one
            for one in started.values():
                one.memory = _memory(one.pid)
            token = await _login(http, cluster)
            targets = await _targets(dsn, facts)
            results: list[RouteResult] = []
            unloaded: dict[str, RouteResult] = {}
            log_start = ctx.server.log_path.stat().st_size
            for name, path_for in _routes(targets):
                unloaded[name] = await _load_route(
                    http, cluster.api_url, token, name, path_for, 1.0, clients=1
                )
                progress(f"scale: {CLIENTS} clients on {name} for {seconds:.0f}s")
                result = await _load_route(http, cluster.api_url, token, name, path_for, seconds)
                p50, p99 = result.percentile(50), result.percentile(99)
                progress(
                    f"  p50 {p50 or 0:.1f} ms, p99 {p99 or 0:.1f} ms, {result.rate:,.0f} req/s, "
                    f"{result.errors} errors {result.statuses}"
                )
                results.append(result)
            api_after = _memory(started["api"].pid)
            with open(ctx.server.log_path, errors="replace") as server_log:
                server_log.seek(log_start)
                slow = slow_statements(server_log.read())
        at_lookup = await _time_position_at(dsn, targets)
        await _explain(dsn, slow)

    for one in started.values():
        report.measures.append(
            FineMeasure(
                f"cold start to ready: {one.name}",
                one.ready_s,
                None,
                "",
                unit="s",
                target=f"< {READY_TARGET_S:g} s",
                met=one.ready_s < READY_TARGET_S,
                notes=f"process start to /readyz 200 over a log of {head:,} events",
            )
        )
    for one in started.values():
        rss = one.memory.get("VmRSS")
        if one.name == "api":
            rss = max(rss or 0.0, api_after.get("VmRSS", 0.0))
        report.measures.append(
            Measure(
                f"resident memory: {one.name}",
                rss,
                None,
                "",
                unit="MiB",
                target=f"< {RSS_TARGET_MIB} MiB",
                met=None if rss is None else rss < RSS_TARGET_MIB,
                notes="VmRSS once ready"
                + (" and after the load (the larger)" if one.name == "api" else ""),
            )
        )
    for result in results:
        p99 = result.percentile(99)
        report.measures.append(
            FineMeasure(
                f"{result.name}: p99",
                p99,
                None,
                "",
                unit="ms",
                count=len(result.latencies_ms),
                target=f"p99 < {P99_TARGET_MS:g} ms",
                met=None if p99 is None else p99 < P99_TARGET_MS and not result.errors,
                notes=f"p50 {result.percentile(50) or 0:.1f} ms, {result.rate:,.0f} req/s, "
                f"{result.errors} errors; alone (1 client): p50 "
                f"{unloaded[result.name].percentile(50) or 0:.1f} ms",
            )
        )
    report.measures.append(
        Measure(
            "?at=timestamp lookup (bisection), worst of the year",
            at_lookup["lookup_ms_max"],
            None,
            "",
            unit="ms",
            target=f"< {AT_LOOKUP_TARGET_MS:g} ms, same answer as a scan",
            met=at_lookup["lookup_ms_max"] < AT_LOOKUP_TARGET_MS and not at_lookup["mismatches"],
            notes=f"median {at_lookup['lookup_ms_median']:.1f} ms over {at_lookup['samples']}"
            f" moments; the backward scan it replaced: median"
            f" {at_lookup['scan_ms_median']:.1f} ms, worst {at_lookup['scan_ms_max']:.1f} ms;"
            f" {at_lookup['mismatches']} different answers",
        )
    )
    report.details.update(
        rebuild_seconds=round(rebuild_s, 2),
        services={
            s.name: {"ready_s": round(s.ready_s, 3), "memory_mib": s.memory}
            for s in started.values()
        },
        api_memory_after_load_mib=api_after,
        routes={
            r.name: {
                "p50_ms": r.percentile(50),
                "p90_ms": r.percentile(90),
                "p99_ms": r.percentile(99),
                "max_ms": max(r.latencies_ms, default=None),
                "mean_ms": statistics.fmean(r.latencies_ms) if r.latencies_ms else None,
                "requests_per_s": round(r.rate, 1),
                "ok": len(r.latencies_ms),
                "errors": r.errors,
                "statuses": r.statuses,
                "seconds": round(r.seconds, 2),
            }
            for r in results
        },
        position_at=at_lookup,
        unloaded_p50_ms={k: v.percentile(50) for k, v in unloaded.items()},
        slow_statements=slow,
        clients=CLIENTS,
        seconds_per_route=seconds,
    )
    report.notes += [
        f"log: {facts['events']:,} events ({facts['experiments']:,} experiments, "
        f"{facts['trials']:,} trials), {facts['table_size']}, COPYed in "
        f"{facts['copy_seconds']:.0f}s; recorded_at {facts['first_recorded_at'][:10]} .. "
        f"{facts['last_recorded_at'][:10]}",
        f"load: {CLIENTS} closed-loop aiohttp clients in the bench process (no wrk/k6 here), "
        f"{seconds:.0f}s per route, sharing {os.cpu_count()} CPUs with the API and PostgreSQL",
        "no service keeps a snapshot: a cold start folds its types from position 0 to its "
        "checkpoint (the checkpoints are at the head)",
        f"memory target {RSS_TARGET_MIB} MiB is this bench's bound, not the issue's",
    ]
    for group in slow[:4]:
        report.notes.append(
            f"slow statement ({group['count']}x, mean {group['mean_ms']} ms, max "
            f"{group['max_ms']:.0f} ms; {'; '.join(group['scans']) or 'no scan node'}): "
            f"{group['query'][:160]}"
        )
    return report
