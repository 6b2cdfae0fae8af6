"""``cairn up`` / ``cairn status`` / ``cairn down``: the embedded cluster on a data directory.

``up`` starts PostgreSQL, nats-server and every service under a supervisor (detached, or in this
process with ``--foreground``); ``status`` shows each process from the state file plus live pid
checks (exit 0 healthy, 1 something down, 3 nothing running); ``down`` stops it all cleanly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from cairn.local import service_credentials
from cairn.local.cluster import spawn_supervisor, supervise
from cairn.local.layout import DEFAULT_DIR_NAME, default_data_dir
from cairn.local.logs import logs_dir, supervisor_log, tail
from cairn.local.options import DEFAULT_API_PORT, STOP_TIMEOUT, ClusterOptions
from cairn.local.state import (
    FAILED,
    HEALTHY,
    STARTING,
    STOPPING,
    ClusterState,
    read_state,
    remember_cluster,
    state_path,
)
from cairn.local.status import describe, running_state, wait_for_exit, wait_for_status
from cairn.local.stopping import reap_leftovers
from cairn.local.supervisor import Supervisor
from events import settings

EXIT_OK = 0
EXIT_DOWN = 1
EXIT_NOT_RUNNING = 3
DOWN_TIMEOUT = 60.0
MAX_REPLICAS = 5


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds the ``up``, ``status`` and ``down`` verbs."""
    data_dir_help = "the cluster's data directory (env CAIRN_HOME; default ./.cairn)"

    up = subparsers.add_parser("up", help="start the embedded cluster")
    up.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    up.add_argument(
        "--slots", type=int, default=None, help="give the agent N CPU slots instead of its GPUs"
    )
    up.add_argument(
        "--agents",
        type=int,
        default=1,
        help="start N agents on this machine, each with --slots (a gang can span them)",
    )
    up.add_argument(
        "--api-port",
        type=int,
        default=DEFAULT_API_PORT,
        help="API port (a free one if taken; 0 for any; default %(default)s)",
    )
    up.add_argument(
        "--foreground", action="store_true", help="supervise in this process; Ctrl-C stops all"
    )
    up.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for start-up (%(default)s)"
    )
    up.add_argument(
        "--stop-timeout",
        type=float,
        default=STOP_TIMEOUT,
        help="seconds a service gets to exit on stop before it is killed (%(default)s)",
    )
    up.add_argument(
        "--replicas",
        type=_replicas,
        default=1,
        help="replicas of each decider (relay, searcher, scheduler); one leads, the others "
        "stand by to take over (default %(default)s)",
    )
    up.set_defaults(handler=cmd_up)

    status = subparsers.add_parser("status", help="show the embedded cluster's processes")
    status.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    status.set_defaults(handler=cmd_status)

    down = subparsers.add_parser("down", help="stop the embedded cluster")
    down.add_argument("--data-dir", type=Path, default=None, help=data_dir_help)
    down.add_argument(
        "--timeout", type=float, default=DOWN_TIMEOUT, help="seconds to wait (%(default)s)"
    )
    down.set_defaults(handler=cmd_down)


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"--replicas must be 1 to {MAX_REPLICAS}, not {text!r}")
    return value


def _data_dir(args: argparse.Namespace) -> Path:
    given: Path | None = args.data_dir
    return given.expanduser().resolve() if given is not None else default_data_dir()


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json:
        print(text, flush=True)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- up


def cmd_up(args: argparse.Namespace) -> int:
    """Starts the cluster (or reports the one already running) and prints its processes."""
    data_dir = _data_dir(args)
    data_dir.mkdir(parents=True, exist_ok=True)
    options = ClusterOptions(
        data_dir=data_dir,
        slots=args.slots,
        agents=max(args.agents, 1),
        api_port=args.api_port,
        timeout=args.timeout,
        stop_timeout=args.stop_timeout,
        replicas=args.replicas,
    )
    state = running_state(data_dir)
    if state is not None and state.status == STOPPING:
        _say(args, f"the cluster on {data_dir} is stopping; waiting for it to finish")
        assert state.supervisor_pid is not None
        wait_for_exit(state.supervisor_pid, state.supervisor_create_time, DOWN_TIMEOUT)
        state = running_state(data_dir)
    if state is not None:
        return _already_running(args, data_dir, state)
    password, generated = service_credentials.ensure_admin_password(
        data_dir, settings.ADMIN_PASSWORD.get()
    )
    shown = password if generated else None
    if args.foreground:
        return _up_foreground(args, options, shown)
    return _up_background(args, options, shown)


def _show_admin_password(args: argparse.Namespace, data_dir: Path, password: str | None) -> None:
    """Shows a password generated at this first start, once (it is kept in the data dir)."""
    if password is not None:
        where = data_dir / service_credentials.ADMIN_PASSWORD_FILE
        _say(args, f"admin password (shown once; kept in {where}, mode 0600): {password}")


def _already_running(args: argparse.Namespace, data_dir: Path, state: ClusterState) -> int:
    if state.status == STARTING and state.supervisor_pid is not None:
        _say(args, f"a cluster is starting on {data_dir}; waiting for it")
        wait_for_status(data_dir, None, state.supervisor_pid, args.timeout)
    report = describe(data_dir)
    if report["healthy"]:
        _say(args, f"a cluster is already running on {data_dir}: nothing to do")
        _print_report(args, report)
        _say(args, "cluster healthy")
        return EXIT_OK
    _say(args, f"a cluster is already running on {data_dir} but is not healthy")
    _print_report(args, report)
    return EXIT_DOWN


def _up_background(args: argparse.Namespace, options: ClusterOptions, password: str | None) -> int:
    data_dir = options.data_dir
    proc = spawn_supervisor(options)
    _say(args, f"starting the cluster on {data_dir} (supervisor pid {proc.pid}) ...")
    try:
        state = wait_for_status(data_dir, proc, proc.pid, options.timeout + 30)
    except KeyboardInterrupt:
        _stop_supervisor(proc)
        return 130
    if proc.poll() is not None and (state is None or state.supervisor_pid != proc.pid):
        other = running_state(data_dir)
        if other is not None:  # another `cairn up` won the race for this data directory
            return _already_running(args, data_dir, other)
    if state is not None and state.status == HEALTHY:
        if data_dir.name == DEFAULT_DIR_NAME:  # the default place: the CLI finds it from anywhere
            remember_cluster(data_dir)
        report = describe(data_dir)
        _print_report(args, report)
        _show_admin_password(args, data_dir, password)
        _say(args, "cluster healthy")
        return EXIT_OK
    if state is not None and state.error:
        _err(f"error: the cluster did not start: {state.error}")
    elif proc.poll() is not None:
        log_tail = tail(supervisor_log(data_dir))
        _err(f"error: the supervisor exited with status {proc.returncode}:\n{log_tail}")
    else:
        _err(f"error: the cluster was not healthy after {options.timeout + 30:.0f}s; stopping it")
    _stop_supervisor(proc)
    _err(f"logs: {logs_dir(data_dir)}")
    if args.json:
        print(json.dumps(describe(data_dir), indent=2))
    return EXIT_DOWN


def _stop_supervisor(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(DOWN_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _up_foreground(args: argparse.Namespace, options: ClusterOptions, password: str | None) -> int:
    data_dir = options.data_dir

    def on_healthy(sup: Supervisor) -> None:
        _print_report(args, describe(data_dir))
        _show_admin_password(args, data_dir, password)
        _say(args, "cluster healthy; press Ctrl-C to stop")

    _say(args, f"starting the cluster on {data_dir} in the foreground ...")
    code = supervise(
        options, notify=lambda msg: _say(args, msg), on_healthy=on_healthy, hangup=True
    )
    state = read_state(data_dir)
    if code != 0:
        error = state.error if state is not None else None
        _err(f"error: the cluster did not start: {error or 'see the logs'}")
        _err(f"logs: {logs_dir(data_dir)}")
        return EXIT_DOWN
    _say(args, "cluster stopped")
    return EXIT_OK


# --------------------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace) -> int:
    """Prints each process of the cluster; 0 if all are healthy, 1 if any is down, 3 if none runs."""
    data_dir = _data_dir(args)
    report = describe(data_dir)
    if report["running"]:
        code = EXIT_OK if report["healthy"] else EXIT_DOWN
    else:
        code = EXIT_DOWN if report["leftovers"] else EXIT_NOT_RUNNING
    if args.json:
        print(json.dumps(report, indent=2))
        return code
    if not report["running"]:
        if report["leftovers"]:
            print(
                f"no supervisor runs on {data_dir}, but these processes are left over: "
                f"{', '.join(report['leftovers'])} (run `cairn down` to stop them)"
            )
        else:
            print(f"no cluster is running on {data_dir}")
            if report["status"] == FAILED and report.get("error"):
                print(f"last start-up failed: {report['error']}")
        return code
    _print_report(args, report)
    print("cluster healthy" if report["healthy"] else f"cluster {report['status']}")
    return code


def _print_report(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"cluster on {report['data_dir']} (supervisor pid {report.get('supervisor_pid')})")
    rows = [["NAME", "PID", "STATE", "RESTARTS", "UPTIME", "LOG"]]
    for proc in report["processes"]:
        rows.append(
            [
                proc["name"],
                str(proc["pid"] or "-"),
                proc["state"],
                str(proc["restarts"]),
                _duration(proc["uptime_s"]),
                proc["log"],
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())
    print(f"database:  {report.get('dsn')}")
    print(f"nats:      {report.get('nats_url')}")
    print(
        f"           (with passwords in {state_path(Path(report['data_dir']))}, readable by you only)"
    )
    print(f"api:       {report.get('api_url')}  (export CAIRN_MASTER={report.get('api_url')})")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


# --------------------------------------------------------------------------- down


def cmd_down(args: argparse.Namespace) -> int:
    """Stops the cluster cleanly (a no-op with a message if none runs)."""
    data_dir = _data_dir(args)
    state = read_state(data_dir)
    if state is None:
        _say(args, f"no cluster is running on {data_dir}")
        _down_json(args, data_dir, stopped=False)
        return EXIT_OK
    if not state.supervisor_alive():
        left = reap_leftovers(state)
        if left:
            _say(args, f"no supervisor was running; stopped leftover processes: {', '.join(left)}")
        else:
            _say(args, f"no cluster is running on {data_dir}")
        _down_json(args, data_dir, stopped=bool(left))
        return EXIT_OK
    pid = state.supervisor_pid
    assert pid is not None
    _say(args, f"stopping the cluster on {data_dir} (supervisor pid {pid}) ...")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not wait_for_exit(pid, state.supervisor_create_time, args.timeout):
        _err(f"the supervisor did not stop within {args.timeout:.0f}s; killing it")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for_exit(pid, state.supervisor_create_time, 10)
        latest = read_state(data_dir)
        if latest is not None:
            reap_leftovers(latest)
        _down_json(args, data_dir, stopped=True)
        return EXIT_DOWN
    latest = read_state(data_dir)
    still = [p.name for p in latest.processes.values() if p.alive()] if latest else []
    if still:
        _err(f"stopped the supervisor, but these are still running: {', '.join(still)}")
        _down_json(args, data_dir, stopped=True)
        return EXIT_DOWN
    _say(args, "cluster stopped")
    _down_json(args, data_dir, stopped=True)
    return EXIT_OK


def _down_json(args: argparse.Namespace, data_dir: Path, *, stopped: bool) -> None:
    if args.json:
        print(json.dumps({"data_dir": str(data_dir), "stopped": stopped}))
