"""A 16-trial ASHA search on the embedded cluster survives a SIGKILL of every service.

``cairn up`` supervises every process; the driver below SIGKILLs each service once, at seeded random
moments while the search runs, and confirms each death (the supervisor reports the exit by
SIGKILL and a new pid). The experiment must still end COMPLETED and the log must pass every
invariant of ``events.check``: no decision appended twice, no slot held twice, no duplicate state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairn.local.cluster import SERVICES
from tests.helpers import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ROOT / "examples" / "scripted"
SEED = int(os.environ.get("CAIRN_TRUST_SEED", "7"))

pytestmark = pytest.mark.timeout(600)


@dataclass
class Local:
    """An embedded cluster: its home directory (CAIRN_HOME)."""

    home: Path

    def cli(self, *args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
        """Runs ``python -m cairn ARGS`` against this cluster."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CAIRN_HOME", "CAIRN_MASTER", "CAIRN_USER", "CAIRN_PASSWORD")
        }
        env.update({"PYTHONPATH": str(ROOT), "CAIRN_HOME": str(self.home)})
        return subprocess.run(
            [sys.executable, "-m", "cairn", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ok(self, *args: str, timeout: float = 150) -> str:
        """Runs the CLI and requires exit 0; returns its standard output."""
        done = self.cli(*args, timeout=timeout)
        assert done.returncode == 0, f"{args} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def status(self) -> dict[str, Any]:
        """``cairn --json status``."""
        report: dict[str, Any] = json.loads(self.cli("--json", "status", timeout=30).stdout)
        return report

    def processes(self) -> dict[str, dict[str, Any]]:
        """The supervised processes by name."""
        return {p["name"]: p for p in self.status()["processes"]}


@pytest.fixture
def local() -> Iterator[Local]:
    """A fresh embedded cluster with two CPU slots, stopped at the end."""
    scratch = Path(tempfile.mkdtemp(prefix="cairn-trust-"))
    cluster = Local(scratch / "home")
    try:
        cluster.ok("up", "--slots", "2", "--api-port", "0", "--stop-timeout", "3")
        yield cluster
    finally:
        cluster.cli("down", timeout=90)
        shutil.rmtree(scratch, ignore_errors=True)


def asha_config(path: Path) -> Path:
    """The scripted example as a 16-trial adaptive ASHA search of short, checkpointing trials."""
    config = yaml.safe_load((SCRIPTED / "config.yaml").read_text())
    config["hyperparameters"].update(
        steps=40,
        report_every=5,
        checkpoint_every=10,
        sleep=0.05,
        width={"type": "int", "minval": 1, "maxval": 1000},
    )
    config["searcher"] = {
        "name": "adaptive_asha",
        "metric": "validation_loss",
        "smaller_is_better": True,
        "max_trials": 16,
        "max_concurrent_trials": 4,
        "time_metric": "batches",
        "max_time": 40,
    }
    config["max_restarts"] = 5
    config["reproducibility"] = {"experiment_seed": SEED}
    path.write_text(yaml.safe_dump(config))
    return path


def created_id(stdout: str) -> int:
    """The id in ``created experiment N``."""
    for line in stdout.splitlines():
        if line.startswith("created experiment"):
            return int(line.split()[2].rstrip(";"))
    raise AssertionError(f"no experiment id in {stdout!r}")


def kill_and_confirm(local: Local, name: str, timeout: float = 60.0) -> int:
    """SIGKILLs service ``name``; returns its pid once the supervisor saw it die by SIGKILL and
    started a new one."""
    before = local.processes()[name]
    os.kill(before["pid"], signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        now: dict[str, Any] = local.processes()[name]
        return now if now["restarts"] > before["restarts"] and now["pid"] != before["pid"] else None

    now = wait_until_sync(
        restarted,
        timeout,
        every=0.2,
        detail=lambda: f"{name} was not restarted: {local.processes()[name]}",
    )
    assert now["exit_code"] == -signal.SIGKILL, now
    return int(before["pid"])


def test_asha_run_survives_every_service_killed_once(local: Local, tmp_path: Path) -> None:
    """Each service SIGKILLed once mid-search: the experiment COMPLETES and the log has 0 findings."""
    config = asha_config(tmp_path / "asha.yaml")
    exp_id = created_id(local.ok("experiment", "create", str(config), str(SCRIPTED)))
    rng = random.Random(SEED)
    victims = list(SERVICES)
    rng.shuffle(victims)
    killed: dict[str, int] = {}
    for name in victims:
        time.sleep(rng.uniform(0.5, 3.0))  # a random moment of the search, not a wait for state
        killed[name] = kill_and_confirm(local, name)
    assert set(killed) == set(SERVICES)

    waited = local.cli("experiment", "wait", str(exp_id), timeout=400)
    assert waited.returncode == 0, f"experiment did not complete:\n{waited.stdout}{waited.stderr}"
    listed = json.loads(local.ok("--json", "experiment", "list-trials", str(exp_id)))
    assert listed["pagination"]["total"] == 16

    dsn = json.loads((local.home / "cluster.json").read_text())["dsn"]  # status masks it
    check = subprocess.run(
        [sys.executable, "-m", "events.check", dsn],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "0 findings" in check.stdout
