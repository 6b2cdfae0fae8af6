"""What every service process shares: flags, logging, connections, readiness, clean shutdown.

A service is ``python -m services.<name> --db DSN --nats URL`` (or env ``CAIRN_DB`` /
``CAIRN_NATS``). When the launcher sets ``CAIRN_READY_FILE``, the service writes that file once it
is connected and serving, which is how ``cairn up`` knows it is healthy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from events import logging as cairn_logging
from events import origin
from events.bus import Bus
from events.errors import EventsError
from events.lease import LeaderLease
from events.store import EventStore


@dataclass
class ServiceContext:
    """Connections and lifecycle handles passed to a service's ``run`` coroutine."""

    name: str
    args: argparse.Namespace
    store: EventStore
    bus: Bus | None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def ready(self) -> None:
        """Announces that the service is up (writes ``CAIRN_READY_FILE`` when set)."""
        path = os.environ.get("CAIRN_READY_FILE")
        if path:
            Path(path).write_text(str(os.getpid()))
        structlog.get_logger(self.name).info("ready", pid=os.getpid())


T = TypeVar("T")
ServiceRun = Callable[[ServiceContext], Awaitable[None]]


def base_parser(name: str) -> argparse.ArgumentParser:
    """The flags every service takes."""
    parser = argparse.ArgumentParser(prog=f"python -m services.{name}")
    parser.add_argument("--db", default=os.environ.get("CAIRN_DB"), help="PostgreSQL DSN")
    parser.add_argument("--nats", default=os.environ.get("CAIRN_NATS"), help="NATS URL")
    parser.add_argument("--log-level", default=os.environ.get("CAIRN_LOG_LEVEL", "INFO"))
    return parser


def main(
    name: str,
    run: ServiceRun,
    *,
    parser: argparse.ArgumentParser | None = None,
    needs_bus: bool = True,
) -> None:
    """Parses flags, connects, runs ``run`` until SIGTERM/SIGINT, and exits non-zero on failure."""
    args = (parser or base_parser(name)).parse_args()
    cairn_logging.configure(name, level=args.log_level)
    origin.set_service(name)
    log = structlog.get_logger(name)
    if not args.db:
        log.error("no database: pass --db or set CAIRN_DB")
        sys.exit(2)
    try:
        asyncio.run(_serve(name, args, run, needs_bus))
    except EventsError as exc:
        log.error("service failed", error=str(exc))
        sys.exit(1)
    except KeyboardInterrupt:
        pass


async def _serve(name: str, args: argparse.Namespace, run: ServiceRun, needs_bus: bool) -> None:
    store = await _retry(lambda: EventStore.connect(args.db))
    bus = await _retry(lambda: Bus.connect(args.nats, name=name)) if needs_bus else None
    ctx = ServiceContext(name=name, args=args, store=store, bus=bus)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ctx.stop.set)
    try:
        await run(ctx)
    finally:
        if bus is not None:
            await bus.close()
        await store.close()


async def _retry(connect: Callable[[], Awaitable[T]], attempts: int = 30) -> T:
    for attempt in range(attempts):
        try:
            return await connect()
        except EventsError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))
    raise AssertionError("unreachable")


async def until_lease_lost(ctx: ServiceContext, lease: LeaderLease) -> None:
    """Returns when the service stops; raises if the leader lease is lost first."""
    lost = asyncio.ensure_future(lease.lost.wait())
    stopped = asyncio.ensure_future(ctx.stop.wait())
    await asyncio.wait([lost, stopped], return_when=asyncio.FIRST_COMPLETED)
    for task in (lost, stopped):
        task.cancel()
    if lease.lost.is_set() and not ctx.stop.is_set():
        raise EventsError(f"{lease.name} lease lost")


async def run_until_stopped(ctx: ServiceContext, *tasks: Awaitable[None]) -> None:
    """Runs ``tasks`` until ``ctx.stop`` is set or one of them fails (which is re-raised)."""
    running: list[asyncio.Future[Any]] = [asyncio.ensure_future(t) for t in tasks]
    stopper: asyncio.Future[Any] = asyncio.ensure_future(ctx.stop.wait())
    done, _ = await asyncio.wait([*running, stopper], return_when=asyncio.FIRST_COMPLETED)
    ctx.stop.set()
    for task in running:
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
    for task in done:
        if task is not stopper:
            task.result()
