"""The embedded cluster end to end: ``cairn up`` / ``status`` / ``down`` as real processes.

Every step runs the CLI as a subprocess against a real PostgreSQL, nats-server and service
processes under a temporary data directory; every test stops its cluster in a ``finally``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import nats
import nats.errors
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cairn.local.topology import SERVICES
from events.domain.types import ExperimentSubmitted
from events.log.store import EventStore
from tests.helpers import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
EVERYTHING = {"postgres", "nats", *SERVICES}


def cairn(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m cairn ARGS`` from the checkout and captures its output."""
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_HOME"}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-m", "cairn", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def up(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """``cairn up`` with two CPU slots, any free API port (parallel runs never collide) and a
    short stop grace period (a service slow to exit on SIGTERM would otherwise cost 10 s)."""
    done = cairn(
        "up", "--data-dir", str(data_dir), "--slots", "2", "--api-port", "0",
        "--stop-timeout", "3",
    )  # fmt: skip
    assert done.returncode == 0, f"cairn up failed:\n{done.stdout}\n{done.stderr}"
    return done


def down(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """``cairn down``; must always succeed."""
    done = cairn("down", "--data-dir", str(data_dir))
    assert done.returncode == 0, f"cairn down failed:\n{done.stdout}\n{done.stderr}"
    return done


def status(data_dir: Path) -> tuple[int, dict[str, Any]]:
    """``cairn --json status``: its exit code and report."""
    done = cairn("--json", "status", "--data-dir", str(data_dir), timeout=30)
    return done.returncode, json.loads(done.stdout)


def processes(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's processes by name."""
    return {p["name"]: p for p in report["processes"]}


async def append_marker(dsn: str) -> str:
    """Appends one event to ``experiment-4242`` and returns its event id."""
    store = await EventStore.connect(dsn)
    try:
        recorded = await store.append(
            "experiment-4242", [ExperimentSubmitted(experiment_id=4242, config={"marker": True})]
        )
        return str(recorded[0].event_id)
    finally:
        await store.close()


async def read_marker(dsn: str) -> list[str]:
    """The event ids on ``experiment-4242``."""
    store = await EventStore.connect(dsn)
    try:
        return [str(e.event_id) for e in await store.read_stream("experiment-4242")]
    finally:
        await store.close()


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running cluster shared by the tests below, on a data dir with a long path."""
    data_dir = tmp_path_factory.mktemp("cluster") / ("a-rather-long-directory-name-" * 4) / "home"
    assert len(str(data_dir)) > 108  # longer than a Unix socket path may be
    try:
        up(data_dir)
        yield data_dir
    finally:
        down(data_dir)


def test_up_status_down_up_keeps_the_log(tmp_path: Path) -> None:
    """up → healthy status → append → down → status 3 → up: the event is still in the log."""
    data_dir = tmp_path / "cairn"
    try:
        first = up(data_dir)
        assert "cluster healthy" in first.stdout
        code, report = status(data_dir)
        assert code == 0, report
        assert report["healthy"] and set(processes(report)) == EVERYTHING
        assert all(p["state"] == "alive" and p["pid"] for p in report["processes"])
        assert report["dsn"].endswith("/cairn") and report["nats_url"].startswith("nats://")
        state = json.loads((data_dir / "cluster.json").read_text())
        assert state["supervisor_pid"] == report["supervisor_pid"]
        assert all((data_dir / "logs" / f"{name}.log").exists() for name in SERVICES)

        event_id = asyncio.run(append_marker(state["dsn"]))

        stopped = down(data_dir)
        assert "cluster stopped" in stopped.stdout
        code, report = status(data_dir)
        assert code == 3 and not report["running"]
        assert cairn("status", "--data-dir", str(data_dir)).returncode == 3
        assert "no cluster" in down(data_dir).stdout  # down again is a no-op

        up(data_dir)
        code, report = status(data_dir)
        assert code == 0, report
        dsn = json.loads((data_dir / "cluster.json").read_text())["dsn"]
        assert dsn.split("@")[0] == state["dsn"].split("@")[0], "same password after down/up"
        assert asyncio.run(read_marker(dsn)) == [event_id]
    finally:
        down(data_dir)


def test_up_when_already_up_is_a_no_op(cluster_dir: Path) -> None:
    """A second ``cairn up`` on a healthy cluster says so, exits 0 and starts nothing."""
    _, before = status(cluster_dir)
    again = up(cluster_dir)
    assert "already running" in again.stdout
    _, after = status(cluster_dir)
    assert after["supervisor_pid"] == before["supervisor_pid"]
    assert {n: p["pid"] for n, p in processes(after).items()} == {
        n: p["pid"] for n, p in processes(before).items()
    }


def test_killed_service_is_reported_and_restarted(cluster_dir: Path) -> None:
    """A SIGKILLed service shows in ``status`` with its exit code and a restart, and comes back."""
    _, report = status(cluster_dir)
    victim = processes(report)["relay"]
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        code, report = status(cluster_dir)
        relay: dict[str, Any] = processes(report)["relay"]
        back = relay["restarts"] >= victim["restarts"] + 1 and relay["state"] == "alive"
        return relay if back and code == 0 else None

    relay = wait_until_sync(
        restarted, 30, every=0.2, detail=lambda: f"relay did not come back: {status(cluster_dir)}"
    )
    assert relay["pid"] != victim["pid"]
    assert relay["exit_code"] == -signal.SIGKILL
    log = (cluster_dir / "logs" / "supervisor.log").read_text()
    assert "process died; restarting" in log and str(victim["pid"]) in log


def test_every_process_of_cairn_up_serves_its_probes_on_loopback(cluster_dir: Path) -> None:
    """``cairn up`` gives every service but the gateway, and the agent, a loopback metrics port
    (in ``status``): each turns ready on /readyz and serves /metrics in Prometheus's format."""
    _, report = status(cluster_dir)
    ports = {
        name.removesuffix("-metrics"): port
        for name, port in report["ports"].items()
        if name.endswith("-metrics")
    }
    assert set(ports) == set(SERVICES) - {"api"}

    def ready(name: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[name]}/readyz", timeout=5):
                return True
        except OSError:
            return False

    for name in ports:
        wait_until_sync(lambda name=name: ready(name), 30, every=0.2)
        url = f"http://127.0.0.1:{ports[name]}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            families = {f.name for f in text_string_to_metric_families(answer.read().decode())}
        assert "cairn_ready" in families, name


async def connect_without_credentials(state: dict[str, Any]) -> list[str]:
    """Connects to the cluster's PostgreSQL and NATS ports with no password; the errors."""
    errors = []
    try:
        conn = await asyncpg.connect(
            f"postgresql://postgres@127.0.0.1:{state['ports']['postgres']}/cairn", timeout=10
        )
        await conn.close()
    except asyncpg.InvalidAuthorizationSpecificationError as exc:
        errors.append(str(exc))
    try:
        nc = await nats.connect(
            f"nats://127.0.0.1:{state['ports']['nats']}",
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=10,
        )
        await nc.close()
    except nats.errors.Error as exc:
        errors.append(str(exc))
    return errors


def test_cluster_requires_credentials_and_never_shows_them(cluster_dir: Path) -> None:
    """PostgreSQL and NATS of ``cairn up`` refuse clients without credentials; the files that
    hold the password, the join token and the bus's keys are owner-only, and no status output,
    log, command line or service environment shows any of them (services get paths)."""
    state = json.loads((cluster_dir / "cluster.json").read_text())
    errors = asyncio.run(connect_without_credentials(state))
    assert len(errors) == 2, errors
    assert "password authentication failed" in errors[0]
    assert "Authorization Violation" in errors[1]
    assert isinstance(asyncio.run(read_marker(state["dsn"])), list)  # the recorded DSN works

    auth = cluster_dir / "nats-auth"
    private = ["cluster.json", "pg.password", "nats.conf", "join.token"]
    private += [str(p.relative_to(cluster_dir)) for p in auth.iterdir()]
    assert {"nats-auth/authority.json", "nats-auth/relay.creds", "nats-auth/api.creds"} <= set(
        private
    )
    for name in private:
        assert (cluster_dir / name).stat().st_mode & 0o777 == 0o600, name
    assert auth.stat().st_mode & 0o777 == 0o700
    pg_password = (cluster_dir / "pg.password").read_text().strip()
    assert pg_password in state["dsn"]
    secrets = [pg_password, (cluster_dir / "join.token").read_text().strip()]
    secrets.append(json.loads((auth / "authority.json").read_text())["signing_seed"])
    for creds in auth.glob("*.creds"):
        secrets.append(creds.read_text().split("-----BEGIN USER NKEY SEED-----\n")[1][:58])
    assert all(len(secret) >= 32 for secret in secrets), secrets

    shown = cairn("status", "--data-dir", str(cluster_dir)).stdout
    shown += cairn("--json", "status", "--data-dir", str(cluster_dir)).stdout
    assert "postgres:***@" in shown
    logs = [p.read_text(errors="replace") for p in cluster_dir.glob("**/*.log")]
    processes = [psutil.Process(p["pid"]) for p in state["processes"].values()]
    command_lines = [" ".join(p.cmdline()) for p in processes]
    environments = [
        " ".join(f"{k}={v}" for k, v in p.environ().items())
        for p in processes
        if p.name() != "postgres"  # PostgreSQL's own environment is the server's business
    ]
    for secret in secrets:
        assert not any(secret in env for env in environments)
    for secret in secrets:
        assert secret not in shown
        assert not any(secret in text for text in logs)
        assert not any(secret in line for line in command_lines)
