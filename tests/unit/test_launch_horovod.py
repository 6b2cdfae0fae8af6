"""The Horovod launcher: clear refusal without Horovod, ranks on one agent with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.launch import horovod

HAVE_HOROVOD = horovod.horovodrun() is not None
ROOT = Path(__file__).resolve().parents[2]

ALLREDUCE = """
import horovod.torch as hvd
import torch
hvd.init()
total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()} sum {total.item():.0f}", flush=True)
"""


@pytest.mark.skipif(HAVE_HOROVOD, reason="Horovod is installed (`make horovod`)")
def test_without_horovod_the_launcher_says_how_to_get_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With no Horovod installed the launcher exits 2 and names `make horovod`."""
    assert horovod.main(["python3", "train.py"]) == 2
    assert "make horovod" in capsys.readouterr().err


@pytest.mark.skipif(not HAVE_HOROVOD, reason="Horovod is not installed: `make horovod` builds it")
def test_horovod_launcher_runs_the_agents_ranks(tmp_path: Path) -> None:
    """Two slots on one agent: horovodrun starts two ranks whose allreduce sums over both."""
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    env = {**os.environ, "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2", "PYTHONPATH": str(ROOT)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        [sys.executable, "-m", "cairn.launch.horovod", sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[rank=0] rank 0 of 2 sum 3" in done.stdout
    assert "[rank=1] rank 1 of 2 sum 3" in done.stdout
