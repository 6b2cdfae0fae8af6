"""What every service process shares: flags, logging, connections, readiness, clean shutdown.

A service is ``python -m services.<name>`` with its DSN and NATS URL read from files
(``--db-file`` / ``--nats-file``, or ``CAIRN_DB_FILE`` / ``CAIRN_NATS_FILE``), as ``cairn up``
starts it; ``--db DSN --nats URL`` (or env ``CAIRN_DB`` / ``CAIRN_NATS``) still work for a service
started by hand, though a command line and an environment are readable by others (see
:mod:`services.credentials`). The NATS URL names the service's NATS credentials file
(``nats://host:4222?creds=/path/relay.creds``, see :mod:`events.log.bus_auth`), and
``--cluster-config PATH`` (``CAIRN_CLUSTER_CONFIG``) the cluster config
(:mod:`events.domain.config.cluster`), read once here and handed to the service. Before it reads its
credentials, the process makes itself undumpable. When the launcher sets ``CAIRN_READY_FILE``,
the service writes that file once it is connected and serving, which is how ``cairn up`` knows
it is healthy. With ``--metrics-address HOST:PORT`` (``CAIRN_METRICS_ADDRESS``) a service other
than the API also serves ``/metrics``, ``/healthz`` and ``/readyz`` there
(:mod:`services.observability.listener`); the API serves them on its own port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from events import settings
from events.domain.config.cluster import ClusterConfig, ClusterConfigError, load_cluster_config
from events.log import logging as cairn_logging
from events.log import origin
from events.log.bus import Bus, BusUrlError, server_urls
from events.log.errors import EventsError, FencedError
from events.log.lease import LeaderLease, lease_timeout
from events.log.store import EventStore
from services import credentials
from services.observability import health
from services.observability.listener import ListenerError
from services.observability.listener import start as start_listener
from services.observability.process import ProcessMetrics


@dataclass
class ServiceContext:
    """Connections and lifecycle handles passed to a service's ``run`` coroutine."""

    name: str
    args: argparse.Namespace
    store: EventStore
    bus: Bus | None
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: ProcessMetrics = field(default_factory=ProcessMetrics)
    announced: bool = False
    role: str | None = None

    def ready(self, role: str | None = None) -> None:
        """Announces that the service is up (writes ``CAIRN_READY_FILE`` when set).

        Args:
            role: for a replicated decider, ``leader`` (holds the lease and has rebuilt its
                state) or ``standby`` (another replica holds the lease).
        """
        self.announced = True
        self.role = role
        path = settings.READY_FILE.get()
        if path is not None:
            path.write_text(str(os.getpid()))
        log = structlog.get_logger(self.name)
        if role is None:
            log.info("ready", pid=os.getpid())
        else:
            log.info("ready", pid=os.getpid(), role=role)


T = TypeVar("T")
ServiceRun = Callable[[ServiceContext], Awaitable[None]]


def base_parser(name: str) -> argparse.ArgumentParser:
    """The flags every service takes."""
    parser = argparse.ArgumentParser(prog=f"python -m services.{name}")
    parser.add_argument(
        "--db-file", default=None, help="file holding the PostgreSQL DSN (CAIRN_DB_FILE)"
    )
    parser.add_argument(
        "--nats-file", default=None, help="file holding the NATS URL (CAIRN_NATS_FILE)"
    )
    parser.add_argument("--db", default=None, help="PostgreSQL DSN (CAIRN_DB; visible to others)")
    parser.add_argument(
        "--nats",
        default=None,
        help="NATS URL (CAIRN_NATS); ?creds=PATH names the service's NATS credentials file",
    )
    parser.add_argument("--log-level", default=settings.LOG_LEVEL.get())
    add_cluster_config_flag(parser)
    if name != "api":  # the gateway serves /metrics and the probes on its own port
        add_metrics_flags(parser)
    return parser


def add_metrics_flags(parser: argparse.ArgumentParser, *, consumers: bool = True) -> None:
    """Adds ``--metrics-address HOST:PORT`` and, for a process that runs consumers,
    ``--ready-max-lag EVENTS``."""
    parser.add_argument(
        "--metrics-address",
        type=metrics_address,
        default=settings.METRICS_ADDRESS.raw(),
        help="serve /metrics, /healthz and /readyz on HOST:PORT, for the internal network "
        "(CAIRN_METRICS_ADDRESS; default: no listener)",
    )
    if not consumers:
        return
    parser.add_argument(
        "--ready-max-lag",
        type=int,
        default=settings.READY_MAX_LAG.get(),
        help="a leader whose consumers are further behind the log than this many events is "
        "not ready (CAIRN_READY_MAX_LAG)",
    )


def metrics_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` parsed for ``--metrics-address`` (argparse names the flag on error)."""
    try:
        address = settings.METRICS_ADDRESS.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is {exc}") from None
    if address is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return address


def add_cluster_config_flag(parser: argparse.ArgumentParser) -> None:
    """Adds ``--cluster-config PATH`` (default ``$CAIRN_CLUSTER_CONFIG``; none: defaults)."""
    parser.add_argument(
        "--cluster-config",
        default=settings.CLUSTER_CONFIG.raw(),
        help="the cluster config file (CAIRN_CLUSTER_CONFIG; default: none, every default)",
    )


def cluster_config_of(args: argparse.Namespace, log: Any) -> ClusterConfig:
    """The cluster config named by ``args.cluster_config``; exits 2 saying why when invalid."""
    try:
        return load_cluster_config(getattr(args, "cluster_config", None))
    except ClusterConfigError as exc:
        log.error("invalid cluster config", error=str(exc))
        sys.exit(2)


def main(
    name: str,
    run: ServiceRun,
    *,
    parser: argparse.ArgumentParser | None = None,
    needs_bus: bool | None = True,
    decider: bool = False,
    consumers: tuple[str, ...] = (),
) -> None:
    """Parses flags, connects, runs ``run`` until SIGTERM/SIGINT, and exits non-zero on failure.

    ``needs_bus``: connect to NATS (``None``: only when a NATS URL was given). ``decider``: the
    service leads by lease (its paused transactions end sooner; see :func:`session_settings`).
    ``consumers``: the checkpoint names the service runs, whose lag its ``/metrics`` shows and
    its ``/readyz`` bounds.
    """
    credentials.make_undumpable()
    args = (parser or base_parser(name)).parse_args()
    cairn_logging.configure(name, level=args.log_level)
    origin.set_service(name)
    log = structlog.get_logger(name)
    try:
        args.db = args.db or credentials.secret("CAIRN_DB", args.db_file)
        args.nats = args.nats or credentials.secret("CAIRN_NATS", args.nats_file)
    except credentials.CredentialsError as exc:
        log.error("cannot read a credential", error=str(exc))
        sys.exit(2)
    if not args.db:
        log.error("no database: pass --db-file or set CAIRN_DB_FILE (or CAIRN_DB)")
        sys.exit(2)
    try:
        args.nats_replicas = settings.NATS_REPLICAS.get()
        if args.nats:
            server_urls(args.nats)
    except (settings.SettingError, BusUrlError) as exc:
        log.error("invalid NATS setting", error=str(exc))
        sys.exit(2)
    cluster = cluster_config_of(args, log)
    tune_gc()
    try:
        bus = bool(args.nats) if needs_bus is None else needs_bus
        asyncio.run(_serve(name, args, run, bus, decider, cluster, consumers))
    except EventsError as exc:
        log.error("service failed", error=str(exc))
        sys.exit(1)
    except ListenerError as exc:
        log.error("cannot start", error=str(exc))
        sys.exit(2)
    except KeyboardInterrupt:
        pass


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation (Python's default: 700)."""


def tune_gc() -> None:
    """Sets the cyclic collector up for a service that folds millions of events.

    A replay allocates several objects per event, and at Python's default thresholds the
    collector runs every 700 allocations and, now and then, walks every object the fold has
    built: much of a replay's time on a big log. What the imports built is frozen
    (never walked again) and the youngest generation is collected every
    :data:`GC_YOUNG_THRESHOLD` allocations; cycles are still collected, a little later.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 20)


IDLE_TRANSACTION_TIMEOUT = 10.0
"""Seconds after which PostgreSQL ends a service's transaction that waits on its client."""


def session_settings(*, decider: bool = False) -> dict[str, str]:
    """Server settings of a service's database sessions.

    A transaction left open by a paused process (SIGSTOP between two statements) may hold the
    append lock and so stall every writer; PostgreSQL ends it after
    :data:`IDLE_TRANSACTION_TIMEOUT`, or for a decider after twice the lease timeout, so that
    the standby taking over from a paused leader can record its election soon after the
    leader's lease has expired.
    """
    seconds = 2 * lease_timeout() if decider else IDLE_TRANSACTION_TIMEOUT
    return {"idle_in_transaction_session_timeout": str(int(seconds * 1000))}


async def _serve(
    name: str,
    args: argparse.Namespace,
    run: ServiceRun,
    needs_bus: bool,
    decider: bool,
    cluster: ClusterConfig,
    consumers: tuple[str, ...],
) -> None:
    settings = session_settings(decider=decider)
    store = await _retry(lambda: EventStore.connect(args.db, settings=settings))
    bus = (
        await _retry(lambda: Bus.connect(args.nats, name=name, replicas=args.nats_replicas))
        if needs_bus
        else None
    )
    ctx = ServiceContext(
        name=name,
        args=args,
        store=store,
        bus=bus,
        cluster=cluster,
        metrics=ProcessMetrics(consumers),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, ctx.stop.set)
    address = getattr(args, "metrics_address", None)
    listener = None
    try:
        if address is not None:
            listener = await start_listener(
                address, checks=lambda: readiness(ctx), exposition=lambda: exposition(ctx)
            )
        await run(ctx)
    finally:
        if listener is not None:
            await listener.cleanup()
        ctx.metrics.close()
        if bus is not None:
            await bus.close()
        await store.close()


async def readiness(ctx: ServiceContext) -> dict[str, str]:
    """The service's readiness checks: it announced itself ready, the database answers, the
    bus is connected, and (unless it stands by) its consumers are within ``--ready-max-lag``."""
    checks = {
        "started": health.OK if ctx.announced else "the service has not finished starting",
        "database": await health.database(ctx.store),
        "bus": health.bus(ctx.bus),
    }
    if ctx.metrics.consumers and checks["database"] == health.OK:
        try:
            head, checkpoints = await asyncio.wait_for(
                ctx.metrics.refresh_lag(ctx.store), health.CHECK_TIMEOUT
            )
        except (EventsError, TimeoutError) as exc:
            checks["caught_up"] = f"could not read the checkpoints: {exc}"
        else:
            if ctx.role != "standby":  # a standby's checkpoints are its leader's
                checks["caught_up"] = health.caught_up(
                    head, checkpoints, ctx.metrics.consumers, ctx.args.ready_max_lag
                )
    ctx.metrics.ready.set(all(result == health.OK for result in checks.values()))
    return checks


async def exposition(ctx: ServiceContext) -> bytes:
    """Refreshes the scrape-time gauges (readiness, consumer lag) and returns ``/metrics``."""
    await readiness(ctx)
    return ctx.metrics.exposition()


async def _retry(connect: Callable[[], Awaitable[T]], attempts: int = 30) -> T:
    for attempt in range(attempts):
        try:
            return await connect()
        except EventsError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(min(0.2 * (attempt + 1), 2.0))
    raise AssertionError("unreachable")


class Follower(Protocol):
    """A decider's state that a standby keeps warm by following the leader's checkpoint."""

    async def rebuild(self) -> None:
        """Folds the log from the start up to the consumer's checkpoint."""

    async def advance(self) -> None:
        """Folds the log from where the state is up to the consumer's checkpoint."""


F = TypeVar("F", bound=Follower)
FOLLOW_EVERY = 0.5
"""Seconds between two catch-ups of a standby's state with the leader's checkpoint."""


async def serve_replica(
    ctx: ServiceContext,
    lease_name: str,
    follow: Callable[[], F],
    lead: Callable[[F, LeaderLease, asyncio.Event], Awaitable[None]],
) -> None:
    """Runs one replica of a decider until the service stops.

    The replica folds the log (``follow()`` makes the state), then waits for the lease while
    following the leader's checkpoint (a hot standby: a takeover folds only what the dead
    leader consumed since the last catch-up), announcing itself ready as a standby if another
    replica holds the lease. It leads for as long as the lease is held: ``lead(state, lease,
    term)`` folds the tail, announces readiness as leader (:meth:`ServiceContext.ready`) and
    works until ``term`` is set. When the lease is lost or its writes are fenced off (it was
    paused and a standby took over) the replica steps down and starts over as a standby.
    """
    log = structlog.get_logger(ctx.name)
    while not ctx.stop.is_set():
        state = follow()
        await state.rebuild()
        acquiring = asyncio.ensure_future(
            LeaderLease.acquire(
                ctx.store, lease_name, stop=ctx.stop, on_standby=lambda: ctx.ready("standby")
            )
        )
        following = asyncio.ensure_future(_follow(ctx.name, state))
        try:
            lease = await acquiring
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        if lease is None:
            return
        term = asyncio.Event()
        ender = asyncio.ensure_future(_end_term(ctx.stop, lease.lost, term))
        try:
            await lead(state, lease, term)
        except FencedError as exc:
            log.warning("fenced off; stepping down", lease=lease_name, error=str(exc))
        finally:
            ender.cancel()
            await lease.release()
        if not ctx.stop.is_set():
            log.warning("lease lost; standing by", lease=lease_name, epoch=lease.epoch)


async def _follow(name: str, state: Follower) -> None:
    while True:
        await asyncio.sleep(FOLLOW_EVERY)
        try:
            await state.advance()
        except EventsError as exc:
            structlog.get_logger(name).warning("standby could not follow", error=str(exc))


async def _end_term(stop: asyncio.Event, lost: asyncio.Event, term: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(lost.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
        term.set()


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
