"""``cairn demo`` end to end: a fresh embedded cluster, a real adaptive ASHA search over the
digits MLP, progress followed through the API, and the best trial reported."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_a_real_asha_search_and_reports_a_best_trial_above_baseline() -> None:
    """A shortened demo search completes, prints its best trial and beats the 0.9 baseline."""
    scratch = Path(tempfile.mkdtemp(prefix="cairn-demo-"))
    scratch.chmod(0o755)  # the unprivileged PostgreSQL user must reach its data directory
    config = yaml.safe_load((ROOT / "examples" / "digits" / "adaptive.yaml").read_text())
    config["searcher"].update(max_trials=4, max_time=400, max_concurrent_trials=2)
    small = scratch / "small.yaml"
    small.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("CAIRN_HOME", "CAIRN_MASTER")}
    env["PYTHONPATH"] = str(ROOT)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "cairn",
                "demo",
                "--data-dir",
                str(scratch / "cluster"),
                "--config",
                str(small),
                "--api-port",
                "0",
                "--stop",
                "--timeout",
                "240",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        out = done.stdout
        assert done.returncode == 0, f"demo failed:\n{out}\n{done.stderr}"
        assert "COMPLETED, 4 trials" in out
        assert re.search(r"best trial \d+: validation_loss", out), out
        assert "hyperparameters: " in out and "lr=" in out
        assert "beats the 0.90 accuracy baseline" in out
        password_file = scratch / "cluster" / "admin.password"
        assert "Web UI:     http://" in out
        assert f"/#/experiments/1  (log in as admin, password in {password_file})" in out
    finally:
        subprocess.run(
            [sys.executable, "-m", "cairn", "down", "--data-dir", str(scratch / "cluster")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        shutil.rmtree(scratch, ignore_errors=True)
