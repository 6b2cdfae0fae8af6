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

ALLOWED_ROOT = "/datasets"
"""The module cluster's only allowed bind mount root (it need not exist: a process task is
given no bind mount)."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster with one CPU slot for the module, allowing bind mounts under
    :data:`ALLOWED_ROOT`."""
    config = f"tasks: {{allowed_bind_mount_roots: [{ALLOWED_ROOT}]}}\n"
    with embedded_cluster("cairn-cmd-", cluster_config=config) as env:
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


def test_cmd_run_starts_in_its_work_dir_inside_the_context(cluster: Env, tmp_path: Path) -> None:
    """`cmd run --config work_dir=sub pwd` prints the sub directory of the command's unpacked
    context and exits 0; `ls` there lists what the context's sub holds."""
    context = tmp_path / "ctx"
    (context / "sub").mkdir(parents=True)
    (context / "sub" / "marker.txt").write_text("here\n", encoding="utf-8")
    (context / "top.txt").write_text("top\n", encoding="utf-8")
    run = ("cmd", "run", "--context", str(context), "--config", "work_dir=sub")
    done = cli(cluster, *run, "pwd", timeout=60)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    (printed,) = done.stdout.split()
    assert Path(printed).name == "sub" and Path(printed).parent.parent.name == "allocations"
    listed = cli(cluster, *run, "ls", timeout=60)
    assert (listed.returncode, listed.stdout.split()) == (0, ["marker.txt"])


def test_a_work_dir_missing_from_the_context_fails_the_start_saying_so(
    cluster: Env, tmp_path: Path
) -> None:
    """A `work_dir` the uploaded context does not hold ends the command failed before it ran,
    exit 1, its message (printed by `cmd run`, kept by `cmd describe`) naming the field."""
    context = tmp_path / "ctx"
    context.mkdir()
    (context / "prep.py").write_text("print('never')\n", encoding="utf-8")
    done = cli(
        cluster, "cmd", "run", "--context", str(context), "--config", "work_dir=data/raw",
        "python", "prep.py", timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    says = "work_dir: 'data/raw' is not a directory of the task's context"
    assert says in done.stderr and "never" not in done.stdout
    task_id = done.stderr.split("launched command ", 1)[1].split()[0]
    described = json.loads(ok(cluster, "--json", "cmd", "describe", task_id).stdout)
    assert (described["outcome"], described["exit_code"]) == ("failed", 1)
    assert says in described["message"]


def test_a_process_command_is_refused_a_disallowed_bind_mount_and_given_no_allowed_one(
    cluster: Env,
) -> None:
    """As for an experiment: a bind mount outside the cluster's allowed roots is refused at
    submission naming ``bind_mounts[0].host_path``; one under them is accepted, and the
    command, run as a process (no container), runs without it."""
    mount = "bind_mounts=[{host_path: %s, container_path: /mnt/in-container}]"
    refused = cli(cluster, "cmd", "run", "--config", mount % "/etc", "true", timeout=60)
    assert refused.returncode != 0
    assert "bind_mounts[0].host_path: /etc is outside the allowed roots [/datasets]" in (
        refused.stderr
    )
    probe = "test -e /mnt/in-container && echo mounted || echo not mounted"
    done = cli(
        cluster, "cmd", "run", "--config", mount % f"{ALLOWED_ROOT}/imagenet",
        "sh", "-c", probe, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "not mounted"), done.stderr
