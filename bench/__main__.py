"""``python -m bench [NAME ...]``: runs the benchmarks against one embedded PostgreSQL.

Every module in :data:`ORDER` that exists runs in that order, then any other ``bench/<name>.py``
defining the hook, alphabetically; those in :data:`OPT_IN` (long) run only when named. The hook
is::

    async def run(ctx: bench.common.BenchContext) -> bench.common.Report

Each benchmark runs in its own ``try``: a failure prints an error line and the others still run;
the exit status is 1 if any failed. Figures are printed, summarized at the end, and written to
``bench/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import pkgutil
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, cast

from bench.common import (
    BenchContext,
    Measure,
    Report,
    cleanup,
    load_average,
    machine_info,
    measures_table,
    progress,
    start_embedded,
    write_results,
)

# The fixed running order. Append new benchmark modules here; names listed but not written yet
# are skipped quietly, and modules not listed still run (after these, alphabetically).
ORDER: tuple[str, ...] = ("event_store", "trials", "ingest")
OPT_IN: tuple[str, ...] = ("scale",)
"""Benchmarks too long for the default run (``python -m bench``): they run only when named."""
_NOT_BENCHMARKS = {"common", "__main__"}

Hook = Callable[[BenchContext], Awaitable[Report]]


def discover() -> list[str]:
    """Names of the benchmark modules present, in running order."""
    here = Path(__file__).resolve().parent
    present = {
        m.name
        for m in pkgutil.iter_modules([str(here)])
        if not m.name.startswith("_") and m.name not in _NOT_BENCHMARKS
    }
    return [n for n in ORDER if n in present] + sorted(present - set(ORDER))


def default_names(available: list[str], named: list[str]) -> list[str]:
    """The benchmarks to run: those ``named`` (in running order), or every available one but
    the :data:`OPT_IN` ones when none is named."""
    if named:
        return [n for n in available if n in named]
    return [n for n in available if n not in OPT_IN]


def load_hook(name: str) -> Hook | None:
    """Imports ``bench.<name>`` and returns its ``run`` coroutine function (None if it has none)."""
    module: ModuleType = importlib.import_module(f"bench.{name}")
    hook = getattr(module, "run", None)
    if hook is None or not asyncio.iscoroutinefunction(hook):
        return None
    return cast(Hook, hook)


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "names", nargs="*", help=f"benchmarks to run (default: all but {', '.join(OPT_IN)})"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--fast",
        action="store_true",
        help="start PostgreSQL with fsync off (not representative; for trying changes quickly)",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply workload sizes (e.g. 0.1 for a look)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    return parser.parse_args(argv)


def _header(ctx: BenchContext, info: dict[str, Any]) -> None:
    print("=" * 78)
    print("cairn bench")
    print(
        f"  machine    : {info['cpu_count']} CPUs ({info['cpus_usable']} usable), "
        f"{info.get('memory_gib', '?')} GiB, {info['cpu_model']}"
    )
    print(f"  platform   : {info['platform']}; load average {info['load_average_at_start']}")
    print(
        f"  python     : {info['python']} (asyncpg {info['asyncpg']}, "
        f"pydantic {info.get('pydantic', '?')})"
    )
    print(f"  postgresql : {ctx.pg_version}")
    mode = "durable (as a real deployment)" if ctx.durable else "FAST: fsync off, NOT durable"
    settings = ", ".join(f"{k}={v}" for k, v in ctx.pg_settings.items())
    print(f"  pg mode    : {mode}; {settings}")
    print(f"  pg data    : {ctx.server.data_dir} (embedded, port {ctx.server.port})")
    if ctx.scale != 1.0:
        print(f"  scale      : {ctx.scale} (workload sizes scaled; figures not comparable)")
    print("=" * 78, flush=True)


async def _run_all(args: argparse.Namespace, names: list[str]) -> int:
    server = tmp = None
    failed: list[str] = []
    summary: list[tuple[str, Measure]] = []
    started = time.perf_counter()
    try:
        progress(f"starting embedded PostgreSQL ({'fsync off' if args.fast else 'durable'})")
        server, tmp = await asyncio.to_thread(start_embedded, durable=not args.fast, keep=args.keep)
        ctx = BenchContext(
            server=server,
            admin_dsn=server.url,
            tmp=tmp,
            durable=not args.fast,
            scale=args.scale,
        )
        await ctx.load_server_facts()
        info = machine_info()
        _header(ctx, info)
        for name in names:
            progress(f"== {name}")
            t0 = time.perf_counter()
            try:
                hook = load_hook(name)
                if hook is None:
                    progress(f"{name}: no `async def run(ctx)`; skipped")
                    continue
                report = await hook(ctx)
            except Exception as exc:  # one benchmark's failure must not stop the others
                failed.append(name)
                traceback.print_exc()
                print(f"ERROR {name}: {type(exc).__name__}: {exc}", flush=True)
                continue
            seconds = time.perf_counter() - t0
            print(f"\n{name} ({seconds:.1f}s):")
            measures_table(report.measures)
            for note in report.notes:
                print(f"  note: {note}")
            summary.extend((name, m) for m in report.measures)
            path = write_results(
                name,
                {
                    "benchmark": name,
                    "finished_at": datetime.now(UTC).isoformat(),
                    "seconds": round(seconds, 2),
                    "machine": info,
                    "postgres": {
                        "version": ctx.pg_version,
                        "durable": ctx.durable,
                        "settings": ctx.pg_settings,
                    },
                    "scale": ctx.scale,
                    "measures": [m.to_json() for m in report.measures],
                    "details": report.details,
                    "notes": report.notes,
                },
            )
            print(f"  results: {path}", flush=True)
    finally:
        cleanup(server, tmp, keep=args.keep)

    total = time.perf_counter() - started
    print("\n" + "=" * 78)
    print(f"SUMMARY (total {total:.1f}s; ratio = cairn / baseline, higher is better)")
    measures_table([m for _, m in summary], prefix=[bench for bench, _ in summary])
    print(f"  load average at end (1/5/15 min): {load_average()}", flush=True)
    if failed:
        print(f"FAILED: {', '.join(failed)}", flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench``; returns the exit status."""
    args = _parse(argv)
    available = discover()
    if args.list:
        print("\n".join(available))
        return 0
    unknown = [n for n in args.names if n not in available]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; have: {', '.join(available)}")
        return 2
    names = default_names(available, args.names)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        return asyncio.run(_run_all(args, names))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
