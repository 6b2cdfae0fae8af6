"""``python -m services.agent``: one agent per machine (see :mod:`services.agent.agent`).

The agent has no database: it talks to the API gateway over HTTP and receives commands from NATS.
It writes ``CAIRN_READY_FILE`` (when set) once registered and subscribed, and shuts down cleanly
on SIGTERM/SIGINT: it stops taking commands, stops its runs and reports their exits (with
``--preempt-on-term``, a first SIGTERM preempts its trial runs first:
:mod:`services.agent.resource_manager`; with ``--reserved-for`` it stops by itself once its one
allocation has ended: :mod:`services.agent.reservation`). With
``--metrics-address HOST:PORT`` it serves ``/metrics``, ``/healthz`` and ``/readyz`` there
(:mod:`services.agent.metrics`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import re
import signal
import socket
import sys
from pathlib import Path

import structlog

from events import settings
from events.log import logging as cairn_logging
from events.log.bus import BusUrlError, server_urls
from services import credentials
from services.agent.agent import Agent
from services.agent.config import AgentConfig
from services.agent.credential import CredentialError
from services.agent.metrics import AgentMetrics
from services.agent.resource_manager import ResourceManagerSignals
from services.agent.runtime import safe_name
from services.observability.listener import ListenerError
from services.observability.listener import start as start_listener
from services.runtime import add_cluster_config_flag, add_metrics_flags, cluster_config_of

_RESERVED_FOR = re.compile(r"^[A-Za-z0-9-][A-Za-z0-9_.:@-]{0,199}$")
"""An allocation id as ``--reserved-for`` takes it (the gateway checks it again)."""


def parser() -> argparse.ArgumentParser:
    """The agent's flags (environment variables in parentheses)."""
    p = argparse.ArgumentParser(prog="python -m services.agent", description=__doc__)
    p.add_argument(
        "--api-url", default=settings.API_URL.get(), help="API gateway URL (CAIRN_API_URL)"
    )
    p.add_argument("--nats-file", default=None, help="file holding the NATS URL (CAIRN_NATS_FILE)")
    p.add_argument("--nats", default=None, help="NATS URL (CAIRN_NATS; visible to others)")
    p.add_argument(
        "--agent-id",
        default=settings.AGENT_ID.get() or socket.gethostname(),
        help="agent id (CAIRN_AGENT_ID; default: hostname)",
    )
    p.add_argument(
        "--artificial-slots", type=int, default=None, help="offer N CPU slots instead of GPUs"
    )
    p.add_argument("--resource-pool", default="default", help="resource pool to join")
    p.add_argument(
        "--reserved-for",
        default=None,
        metavar="ALLOCATION_ID",
        help="an ephemeral agent started for this one allocation (a Slurm job's): it takes "
        "nothing else and stops once that allocation has ended here",
    )
    p.add_argument(
        "--reserved-wait",
        type=float,
        default=AgentConfig.reserved_wait,
        metavar="SECONDS",
        help="with --reserved-for: stop when the allocation has not started here this many "
        "seconds after registration (default: %(default)s)",
    )
    p.add_argument(
        "--preempt-on-term",
        action="store_true",
        help="a first SIGTERM (and every SIGUSR2) asks the API to preempt this agent's trial "
        "runs, so they checkpoint and are requeued, before the agent stops; a second SIGTERM "
        "stops it at once (for agents run by a resource manager such as Slurm)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=settings.AGENT_WORK_DIR.get(),
        help="run directories and code cache (CAIRN_AGENT_WORK_DIR; default: "
        "$CAIRN_HOME/agents/<id> or ~/.cairn/agents/<id>)",
    )
    p.add_argument(
        "--checkpoint-root",
        type=Path,
        default=settings.CHECKPOINT_ROOT.get(),
        help="checkpoint storage for experiments without checkpoint_storage "
        "(CAIRN_CHECKPOINT_ROOT; default: $CAIRN_HOME/checkpoints or <work-dir>/checkpoints)",
    )
    p.add_argument(
        "--join-token-file",
        type=Path,
        default=settings.JOIN_TOKEN_FILE.get(),
        help="file (mode 0600) with the cluster's join token, presented once on the agent's "
        "first start for its own credential (CAIRN_JOIN_TOKEN_FILE)",
    )
    p.add_argument(
        "--agent-token",
        default=settings.AGENT_TOKEN.get() or "",
        help="the join token by value, for clusters configured that way (CAIRN_AGENT_TOKEN); "
        "prefer --join-token-file",
    )
    p.add_argument("--heartbeat", type=float, default=2.0, help="seconds between heartbeats")
    p.add_argument(
        "--preempt-timeout",
        type=float,
        default=30.0,
        help="seconds a preempted run gets to exit before SIGTERM",
    )
    p.add_argument(
        "--kill-grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL"
    )
    p.add_argument(
        "--rendezvous-timeout",
        type=float,
        default=settings.RENDEZVOUS_TIMEOUT.get(),
        help="seconds a run on several agents waits for all of them before it fails "
        "(CAIRN_RENDEZVOUS_TIMEOUT)",
    )
    p.add_argument(
        "--address",
        default=settings.AGENT_ADDRESS.get(),
        help="address the other agents of a gang reach this one by (CAIRN_AGENT_ADDRESS; "
        "default: this machine's address on the route to the API)",
    )
    p.add_argument(
        "--docker-share-from",
        default=settings.DOCKER_SHARE_FROM.get(),
        help="the container this agent runs in ('self': this host name); trial containers "
        "share its volumes and network (CAIRN_DOCKER_SHARE_FROM)",
    )
    p.add_argument(
        "--hide",
        type=Path,
        action="append",
        default=[],
        help="a path no trial may see (repeatable; the work directory and $CAIRN_HOME always "
        "are hidden)",
    )
    add_cluster_config_flag(p)
    add_metrics_flags(p, consumers=False)
    p.add_argument("--log-level", default=settings.LOG_LEVEL.get())
    p.add_argument("--db", default=None, help=argparse.SUPPRESS)  # accepted, unused: no database
    return p


def main(argv: list[str] | None = None) -> int:
    """Parses flags and runs the agent until SIGTERM/SIGINT; returns the exit status."""
    credentials.make_undumpable()
    args = parser().parse_args(argv)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` dumps every thread's stack
    cairn_logging.configure("agent", level=args.log_level)
    log = structlog.get_logger("agent")
    try:
        args.nats = args.nats or credentials.secret("CAIRN_NATS", args.nats_file)
    except credentials.CredentialsError as exc:
        log.error("cannot read a credential", error=str(exc))
        return 2
    if not args.api_url or not args.nats:
        log.error("need --api-url and --nats-file (or CAIRN_API_URL / CAIRN_NATS_FILE)")
        return 2
    try:
        server_urls(args.nats)
        nats_replicas = settings.NATS_REPLICAS.get()
    except (settings.SettingError, BusUrlError) as exc:
        log.error("invalid NATS setting", error=str(exc))
        return 2
    if args.artificial_slots is not None and args.artificial_slots < 1:
        log.error("--artificial-slots must be at least 1")
        return 2
    if args.reserved_for is not None and not _RESERVED_FOR.match(args.reserved_for):
        log.error("--reserved-for must name an allocation id", value=args.reserved_for)
        return 2
    if args.reserved_wait <= 0:
        log.error("--reserved-wait must be positive", value=args.reserved_wait)
        return 2
    cairn_home = settings.cairn_home()
    work_dir = args.work_dir or settings.home_or_user_dir() / "agents" / safe_name(args.agent_id)
    checkpoint_root = args.checkpoint_root
    if checkpoint_root is None and cairn_home is not None:
        checkpoint_root = cairn_home / "checkpoints"
    cluster = cluster_config_of(args, log)
    config = AgentConfig(
        agent_id=args.agent_id,
        api_url=args.api_url,
        nats_url=args.nats,
        nats_replicas=nats_replicas,
        token=args.agent_token,
        join_token_file=args.join_token_file,
        resource_pool=args.resource_pool,
        work_dir=work_dir.absolute(),
        checkpoint_root=checkpoint_root.absolute() if checkpoint_root else None,
        artificial_slots=args.artificial_slots,
        heartbeat=args.heartbeat,
        preempt_timeout=args.preempt_timeout,
        kill_grace=args.kill_grace,
        rendezvous_timeout=args.rendezvous_timeout,
        address=args.address,
        docker_share_from=(
            socket.gethostname() if args.docker_share_from == "self" else args.docker_share_from
        )
        or None,
        host_policy=cluster.tasks,
        default_image=cluster.tasks.default_image,
        hide=tuple(p.absolute() for p in args.hide)
        + ((Path(cairn_home).absolute(),) if cairn_home else ()),
        reserved_for=args.reserved_for,
        reserved_wait=args.reserved_wait,
        preempt_on_term=args.preempt_on_term,
    )
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(config, args.metrics_address))
    except CredentialError as exc:
        log.error("no credential", error=str(exc))
        return 1
    except ListenerError as exc:
        log.error("cannot start", error=str(exc))
        return 2
    return 0


async def _serve(config: AgentConfig, metrics_address: tuple[str, int] | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    agent = Agent(config)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if config.preempt_on_term:
        handlers = ResourceManagerSignals(agent, stop)
        loop.add_signal_handler(signal.SIGTERM, handlers.terminate)
        loop.add_signal_handler(signal.SIGUSR2, handlers.warn)
    else:
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    listener = None
    if metrics_address is not None:
        metrics = AgentMetrics(agent)
        listener = await start_listener(
            metrics_address, checks=metrics.checks, exposition=metrics.exposition
        )
    try:
        await agent.run(stop)
    finally:
        if listener is not None:
            await listener.cleanup()


if __name__ == "__main__":
    sys.exit(main())
