"""``cairn cmd`` end to end on an embedded cluster (``cairn up --slots 1``): a command task is
submitted with its context, scheduled, launched by the agent, its output shipped, and the CLI
exits with the command's exit code."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import Env, cli, embedded_cluster, ok
from tests.helpers import wait_until_sync


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster with one CPU slot for the module."""
    with embedded_cluster("cairn-cmd-") as env:
        yield env


def test_cmd_run_exits_with_the_commands_code_and_its_logs_show_its_output(
    cluster: Env, tmp_path: Path
) -> None:
    """`cairn cmd run` of a context script printing a line and exiting 3 returns 3 and prints
    the line; `cmd logs` and `cmd describe` show the line and the exit code afterwards."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "prep.py").write_text(
        "import sys\nprint('prepared 42 shards')\nsys.exit(3)\n", encoding="utf-8"
    )
    done = cli(cluster, "cmd", "run", "--context", str(context), "python", "prep.py", timeout=60)
    assert done.returncode == 3, f"{done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "prepared 42 shards" in done.stdout
    task_id = done.stderr.split("launched command ", 1)[1].split()[0]

    logs = ok(cluster, "cmd", "logs", task_id)
    assert "prepared 42 shards" in logs.stdout
    described = json.loads(ok(cluster, "--json", "cmd", "describe", task_id).stdout)
    assert (described["state"], described["outcome"], described["exit_code"]) == (
        "TERMINATED",
        "failed",
        3,
    )
    listed = json.loads(ok(cluster, "--json", "cmd", "list").stdout)
    assert task_id in [t["id"] for t in listed["tasks"]]


def test_cmd_kill_stops_a_running_command(cluster: Env) -> None:
    """A detached command that prints and sleeps is killed by `cmd kill`: it ends `killed`, its
    slot is free again for the next command, and its output so far is kept."""
    script = "import time; print('started', flush=True); time.sleep(600)"
    task_id = ok(cluster, "cmd", "run", "-d", "python", "-c", script).stdout.strip()

    def describe() -> dict[str, Any]:
        return dict(json.loads(ok(cluster, "--json", "cmd", "describe", task_id).stdout))

    wait_until_sync(lambda: "started" in ok(cluster, "cmd", "logs", task_id).stdout, timeout=30)
    assert describe()["state"] == "RUNNING"
    ok(cluster, "cmd", "kill", task_id)
    ended = wait_until_sync(
        lambda: (task := describe())["state"] == "TERMINATED" and task, timeout=30
    )
    assert ended["outcome"] == "killed"
    done = cli(cluster, "cmd", "run", "python", "-c", "print('next')", timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "next")
