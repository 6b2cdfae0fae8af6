"""The embedded cluster behind ``cairn up`` / ``status`` / ``down``: running its supervisor.

A cluster is one supervisor (:mod:`cairn.local.supervisor`) on a data directory: it starts a real
PostgreSQL, a nats-server and every service, restarts what dies and stops everything in order on
SIGTERM/SIGINT. This module runs it: :func:`supervise` in this process, :func:`spawn_supervisor`
as ``python -m cairn.local.cluster supervise`` detached (whose command line :func:`_main` reads).
The supervisor and every service make themselves undumpable.

In the default (background) mode ``cairn up`` spawns the supervisor detached and waits until the
state file says ``healthy`` (:mod:`cairn.local.status`); with ``--foreground`` the same loop runs
in the CLI process. The Postgres data directory survives ``down``/``up``, and so does the log.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cairn.local.environment import child_env
from cairn.local.lock import supervisor_lock
from cairn.local.logs import configure_logging, logs_dir, supervisor_log
from cairn.local.options import DEFAULT_API_PORT, STOP_TIMEOUT, ClusterOptions
from cairn.local.signals import stop_signals
from cairn.local.supervisor import ClusterStartError, StartInterrupted, Supervisor
from services import credentials


def supervise(
    options: ClusterOptions,
    *,
    notify: Callable[[str], None] | None = None,
    on_healthy: Callable[[Supervisor], None] | None = None,
    hangup: bool = False,
) -> int:
    """Runs a supervisor in this process until SIGTERM/SIGINT; returns its exit code.

    Args:
        options: what to start and where.
        notify: receives one-line messages about restarts and failures.
        on_healthy: called once every service is ready.
        hangup: also treat SIGHUP as a stop request (a terminal that goes away).

    Returns:
        0 after a clean stop (including a stop requested during start-up), 1 if start-up failed.

    Raises:
        ClusterStartError: another supervisor runs on the data directory.
    """
    credentials.make_undumpable()
    with supervisor_lock(options.data_dir):
        logs_dir(options.data_dir).mkdir(parents=True, exist_ok=True)
        with open(supervisor_log(options.data_dir), "a", buffering=1) as stream:
            configure_logging(stream)
            sup = Supervisor(options, notify=notify)
            with stop_signals(sup.request_stop, hangup=hangup):
                try:
                    sup.start()
                except StartInterrupted:
                    return 0
                except ClusterStartError:
                    return 1
                if on_healthy is not None:
                    on_healthy(sup)
                sup.run()
    return 0


def spawn_supervisor(options: ClusterOptions) -> subprocess.Popen[bytes]:
    """Starts ``python -m cairn.local.cluster supervise`` detached (its own session)."""
    cmd = [
        sys.executable, "-m", "cairn.local.cluster", "supervise",
        "--data-dir", str(options.data_dir),
        "--timeout", str(options.timeout),
        "--api-port", str(options.api_port),
        "--stop-timeout", str(options.stop_timeout),
        "--replicas", str(options.replicas),
    ]  # fmt: skip
    if options.slots is not None:
        cmd += ["--slots", str(options.slots)]
    if options.agents != 1:
        cmd += ["--agents", str(options.agents)]
    logs_dir(options.data_dir).mkdir(parents=True, exist_ok=True)
    with open(supervisor_log(options.data_dir), "ab") as out:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=options.data_dir,
            env=child_env(),
            start_new_session=True,
        )


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cairn.local.cluster")
    sub = parser.add_subparsers(dest="command", required=True)
    sup = sub.add_parser("supervise", help="run the supervisor of an embedded cluster")
    sup.add_argument("--data-dir", type=Path, required=True)
    sup.add_argument("--slots", type=int, default=None)
    sup.add_argument("--agents", type=int, default=1)
    sup.add_argument("--api-port", type=int, default=DEFAULT_API_PORT)
    sup.add_argument("--timeout", type=float, default=60.0)
    sup.add_argument("--stop-timeout", type=float, default=STOP_TIMEOUT)
    sup.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args(argv)
    options = ClusterOptions(
        data_dir=args.data_dir.resolve(),
        slots=args.slots,
        api_port=args.api_port,
        timeout=args.timeout,
        stop_timeout=args.stop_timeout,
        replicas=args.replicas,
        agents=args.agents,
    )
    try:
        return supervise(options)
    except ClusterStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_main())
