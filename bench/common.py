"""Shared helpers for ``make bench``: the embedded server, timers, progress lines and tables.

A benchmark module is any ``bench/<name>.py`` with a coroutine ``run(ctx: BenchContext) ->
Report``. It creates what it needs (usually a database of its own via
:meth:`BenchContext.create_database`) on the one PostgreSQL that ``python -m bench`` starts, prints
progress with :func:`progress`, and returns its figures as :class:`Measure` rows; ``__main__``
prints them, adds them to the final summary and writes them to ``bench/results/<name>.json``.

Benchmarks print figures; they are never pass/fail timed tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from cairn.local.servers import ServerProcess, start_postgres

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_START = time.perf_counter()


def progress(message: str) -> None:
    """Prints a timestamped progress line (seconds since the bench started) and flushes."""
    print(f"[{time.perf_counter() - _START:7.1f}s] {message}", flush=True)


class Stopwatch:
    """Measures a ``with`` block: wall ``seconds`` and this process's ``cpu_seconds``.

    CPU time excludes the server's work but is less disturbed by other load on the machine.
    """

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = 0.0
        self._cpu_started = 0.0
        self.cpu_seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        self._cpu_started = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.started
        self.cpu_seconds = time.process_time() - self._cpu_started

    def summary(self, count: int) -> str:
        """``"1.2s, 3.40 us/event (2.10 us CPU here)"`` for ``count`` events."""
        per = 1e6 / count if count else 0.0
        return (
            f"{self.seconds:.1f}s, {self.seconds * per:.2f} us/event, "
            f"{self.cpu_seconds * per:.2f} us/event CPU in this process"
        )

    @property
    def elapsed(self) -> float:
        """Seconds since the block was entered (for progress lines inside it)."""
        return time.perf_counter() - self.started


@contextlib.contextmanager
def timed() -> Iterator[Stopwatch]:
    """``with timed() as t: ...`` then ``t.seconds``."""
    with Stopwatch() as watch:
        yield watch


def per_second(count: int, seconds: float) -> float:
    """``count / seconds``, guarding against a zero duration."""
    return count / seconds if seconds > 0 else float("inf")


def fmt_rate(value: float | None, decimals: int = 0) -> str:
    """A rate with thousands separators (``12,345``); ``-`` when absent."""
    if value is None:
        return "-"
    return f"{value:,.{decimals}f}"


def fmt_ratio(value: float | None) -> str:
    """A ratio as ``0.42x``; ``-`` when absent."""
    return "-" if value is None else f"{value:.2f}x"


@dataclass
class Measure:
    """One figure: cairn's rate beside a baseline's, both in ``unit`` (higher is better).

    ``ratio`` is cairn / baseline: 1.0 means as fast as the baseline, 0.25 means a quarter of it.
    """

    name: str
    cairn: float | None
    baseline: float | None
    baseline_label: str
    unit: str = "events/s"
    count: int = 0
    notes: str = ""
    target: str = ""
    """The goal this figure is held to, as shown in the table (``>= 0.5x``, ``< 100 ms``)."""
    met: bool | None = None
    """Whether the goal was met (``None``: no goal, or not decidable from this run)."""

    @property
    def ratio(self) -> float | None:
        """cairn / baseline, when both exist."""
        if self.cairn is None or not self.baseline:
            return None
        return self.cairn / self.baseline

    def to_json(self) -> dict[str, Any]:
        """The measure as a JSON-able dict (ratio included)."""
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


@dataclass
class Report:
    """What a benchmark module's ``run`` returns."""

    measures: list[Measure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, indent: int = 2) -> None:
    """Prints an aligned text table; the first column is left-aligned, the others right."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return " " * indent + " | ".join(parts)

    print(line(headers))
    print(" " * indent + "-+-".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


def measures_table(measures: Sequence[Measure], *, prefix: Sequence[str] | None = None) -> None:
    """Prints measures as ``measure | cairn | baseline | ratio`` (``prefix``: per-row labels)."""
    rows = [
        [
            f"{prefix[i]}: {m.name}" if prefix else m.name,
            fmt_rate(m.cairn, _decimals(m)),
            f"{fmt_rate(m.baseline, _decimals(m))} ({m.baseline_label})"
            if m.baseline_label
            else "-",
            fmt_ratio(m.ratio),
            _goal(m),
        ]
        for i, m in enumerate(measures)
    ]
    print_table([f"measure ({_unit(measures)})", "cairn", "baseline", "ratio", "goal"], rows)


def _goal(measure: Measure) -> str:
    """The goal column: the target, then ``met``/``MISSED`` when the run decided it."""
    if not measure.target:
        return "-"
    verdict = {True: " met", False: " MISSED", None: ""}[measure.met]
    return f"{measure.target}{verdict}"


def _decimals(measure: Measure) -> int:
    """Decimals shown for a measure: 0, unless a subclass sets the class attribute ``decimals``."""
    return int(getattr(measure, "decimals", 0))


def _unit(measures: Sequence[Measure]) -> str:
    units = {m.unit for m in measures}
    return units.pop() if len(units) == 1 else "units: see JSON"


def load_average() -> str:
    """The 1/5/15-minute load averages (other work on the machine skews every figure)."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def machine_info() -> dict[str, Any]:
    """CPU, memory and Python facts for the header and the JSON results."""
    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "asyncpg": asyncpg.__version__,
        "load_average_at_start": load_average(),
    }
    with contextlib.suppress(Exception):
        import psutil
        import pydantic

        info["pydantic"] = pydantic.VERSION
        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for text_line in Path("/proc/cpuinfo").read_text().splitlines():
            if text_line.startswith("model name"):
                return text_line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


_PG_SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "max_wal_size",
)


@dataclass
class BenchContext:
    """What every benchmark gets: one embedded PostgreSQL, its facts, and a scratch directory.

    Attributes:
        server: the embedded PostgreSQL server process.
        admin_dsn: DSN of its ``postgres`` database (for creating others).
        tmp: a scratch directory removed at the end.
        durable: False when started with ``--fast`` (fsync off).
        scale: multiplies the sizes of the workloads (``--scale 0.1`` for a quick look).
        pg_version: ``SELECT version()``.
        pg_settings: durability-related settings, as ``SHOW`` reports them.
    """

    server: ServerProcess
    admin_dsn: str
    tmp: Path
    durable: bool
    scale: float = 1.0
    pg_version: str = ""
    pg_settings: dict[str, str] = field(default_factory=dict)

    def scaled(self, n: int, minimum: int = 1) -> int:
        """``n`` times ``scale``, at least ``minimum``."""
        return max(minimum, round(n * self.scale))

    async def create_database(self, name: str) -> str:
        """(Re)creates an empty database ``name`` and returns its DSN."""
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.admin_dsn.rsplit("/", 1)[0] + f"/{name}"

    async def load_server_facts(self) -> None:
        """Fills ``pg_version`` and ``pg_settings`` from the running server."""
        conn = await asyncpg.connect(self.admin_dsn)
        try:
            self.pg_version = str(await conn.fetchval("SELECT version()"))
            for name in _PG_SETTINGS:
                self.pg_settings[name] = str(await conn.fetchval(f"SHOW {name}"))
        finally:
            await conn.close()


def start_embedded(*, durable: bool, keep: bool) -> tuple[ServerProcess, Path]:
    """Starts PostgreSQL in a fresh temporary directory; returns it and the directory."""
    tmp = Path(tempfile.mkdtemp(prefix="cairn-bench-"))
    try:
        server = start_postgres(tmp / "pg", fast=not durable)
    except BaseException:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return server, tmp


def cleanup(server: ServerProcess | None, tmp: Path | None, *, keep: bool) -> None:
    """Stops the server and removes the scratch directory (unless ``keep``)."""
    if server is not None:
        with contextlib.suppress(Exception):
            server.stop()
    if tmp is not None:
        if keep:
            print(f"kept scratch directory {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Writes ``bench/results/<name>.json`` (creating the directory) and returns its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path
