"""Unmanaged runs on a live cluster: a Determined-style ``core_v2`` script started as a plain
process with ``DET_MASTER`` set reports to the cluster, resumes by its external ids, ends
COMPLETED or ERROR, is ended ERROR when killed outright, reports once from two ranks, and stays
invisible to other users."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cairn.compat import install_path
from cairn.local.servers import ServerProcess
from events.domain import lifecycle
from events.domain.aggregates import fold_trial
from events.domain.names import trial_stream
from events.log.store import EventStore
from tests.e2e.harness import Cluster
from tests.helpers import process_alive, wait_until

ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_TIMEOUT = 3

SCRIPT = """
import json, sys, time
from determined.experimental import core_v2

trial_id, storage, mode = sys.argv[1], sys.argv[2], sys.argv[3]
distributed = None
if mode == "ranks":
    import torch.distributed
    torch.distributed.init_process_group("gloo")
    distributed = core_v2.DistributedContext.from_torch_distributed()
core_v2.init(config=core_v2.Config(
    name="laptop-run", hparams={"lr": 0.5},
    external_experiment_id="exp-1", external_trial_id=trial_id,
    checkpoint_storage=storage), distributed=distributed)
start = 0
if core_v2.info.latest_checkpoint:
    with core_v2.checkpoint.restore_path(core_v2.info.latest_checkpoint) as path:
        start = int((path / "step").read_text())
for step in range(start, start + 3):
    core_v2.train.report_training_metrics(steps_completed=step + 1, metrics={"loss": 1 / (step + 1)})
if core_v2.distributed.rank == 0:
    with core_v2.checkpoint.store_path({"steps_completed": start + 3}) as (path, uuid):
        (path / "step").write_text(str(start + 3))
print(json.dumps({"start": start, "run": core_v2.info.trial.trial_run_id,
                  "trial_id": core_v2.info.trial.trial_id,
                  "experiment_id": core_v2.info.trial.experiment_id,
                  "latest": core_v2.info.latest_checkpoint,
                  "url": core_v2.url_reverse_webui_exp_view()}), flush=True)
if mode == "fail":
    raise RuntimeError("the script fails")
if mode == "hang":
    time.sleep(600)
"""


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """The control plane and the tracker (no agent: unmanaged runs need none), with a short
    heartbeat timeout."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    assert c.cluster_config is not None
    with c.cluster_config.open("a") as fh:
        fh.write(f"unmanaged:\n  heartbeat_timeout: {HEARTBEAT_TIMEOUT}s\n")
    c.start_services(timeout=30)
    c.start("tracker", "services.tracker")
    try:
        await c.login()
        yield c
    finally:
        c.stop()


def script_env(cluster: Cluster, home: Path, user: str, password: str) -> dict[str, str]:
    """A plain process's environment: the master and a user, nothing of a trial."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "DET_"))}
    environ.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(install_path())]),
        DET_MASTER=cluster.api_url,
        DET_USER=user,
        DET_PASS=password,
        CAIRN_HOME=str(home),
    )
    return environ


def run(cluster: Cluster, tmp_path: Path, trial: str, mode: str = "ok", **user: str) -> Any:
    """Runs the script to its end; returns (exit status, its JSON line or None, stderr)."""
    who = user or {"user": "admin", "password": cluster.admin_password}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, trial, str(tmp_path / "ckpt"), mode],
        cwd=tmp_path,
        env=script_env(cluster, tmp_path / f"home-{who['user']}", who["user"], who["password"]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, json.loads(lines[-1]) if lines else None, done.stderr


def start_script(cluster: Cluster, tmp_path: Path, trial: str, mode: str) -> subprocess.Popen[str]:
    """Starts the script as the admin and leaves it running."""
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, trial, str(tmp_path / "ckpt"), mode],
        cwd=tmp_path,
        env=script_env(cluster, tmp_path / "home", "admin", cluster.admin_password),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_ranks(cluster: Cluster, tmp_path: Path, trial: str) -> subprocess.CompletedProcess[str]:
    """Runs the script as two ranks under ``torchrun --standalone``, as the admin."""
    torchrun = Path(sys.executable).with_name("torchrun")
    return subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node=2",
            "--no-python",
            sys.executable,
            "-c",
            SCRIPT,
            trial,
            str(tmp_path / "ckpt"),
            "ranks",
        ],
        cwd=tmp_path,
        env=script_env(cluster, tmp_path / "home", "admin", cluster.admin_password),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


async def trial_state(store: EventStore, trial_id: int) -> str:
    """The trial's lifecycle state folded from its stream."""
    return fold_trial(trial_id, await store.read_stream(trial_stream(trial_id))).state


async def test_a_script_reports_resumes_by_external_ids_and_ends_errored_on_failure(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """Run 1's metrics reach the API and it ends COMPLETED; run 2 (same ids) resumes the same
    trial from run 1's checkpoint and, raising, ends ERROR; both runs' output is in the trial's
    logs; the experiment is marked unmanaged, refuses pause (409), and no allocation holds a
    slot."""
    code, first, err = run(cluster, tmp_path, "trial-a")
    assert code == 0, err
    trial_id = first["trial_id"]
    assert (first["start"], first["run"], first["latest"]) == (0, 1, None)
    assert await trial_state(store, trial_id) == lifecycle.COMPLETED

    async def metrics_seen() -> bool:
        data = await cluster.request("GET", f"/trials/{trial_id}/metrics")
        return sorted(m["steps_completed"] for m in data["metrics"]) == [1, 2, 3]

    await wait_until(metrics_seen, timeout=30, detail=cluster.logs)
    detail = await cluster.request("GET", f"/experiments/{first['experiment_id']}")
    assert detail["unmanaged"] is True and detail["state"] == lifecycle.ACTIVE

    async def listed() -> bool:
        page = await cluster.request("GET", "/experiments")
        return any(
            e["id"] == first["experiment_id"] and e["unmanaged"] for e in page["experiments"]
        )

    await wait_until(listed, timeout=30, detail=cluster.logs)
    with pytest.raises(AssertionError, match=r"409.*unmanaged"):
        await cluster.action(first["experiment_id"], "pause")

    code, second, err = run(cluster, tmp_path, "trial-a", "fail")
    assert code == 1 and "the script fails" in err
    assert (second["trial_id"], second["run"], second["start"]) == (trial_id, 2, 3)
    assert second["latest"] is not None
    assert await trial_state(store, trial_id) == lifecycle.ERROR
    logs = (await cluster.request("GET", f"/trials/{trial_id}/logs"))["logs"]
    shipped = {(entry["allocation_id"], entry["stream"], entry["line"]) for entry in logs}
    assert (f"{trial_id}.1", "stdout", json.dumps(first)) in shipped
    assert (f"{trial_id}.2", "stderr", "RuntimeError: the script fails") in shipped
    allocated = [
        e.payload
        for e in await store.read_stream(trial_stream(trial_id))
        if e.type == "SlotsAllocated"
    ]
    assert [a["placements"] for a in allocated] == [{}, {}]


async def test_a_killed_script_is_marked_errored_after_the_heartbeat_timeout(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """A script SIGKILLed mid-run (its process proven dead) leaves its run open until the
    heartbeat timeout passes; then the trial is ERROR with a lost run, decided once."""
    proc = start_script(cluster, tmp_path, "trial-k", "hang")
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("{"), proc.stderr.read() if proc.stderr else ""
    trial_id = json.loads(line)["trial_id"]
    assert await trial_state(store, trial_id) == lifecycle.ACTIVE
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert not process_alive(proc.pid)

    async def errored() -> bool:
        return await trial_state(store, trial_id) == lifecycle.ERROR

    await wait_until(errored, timeout=HEARTBEAT_TIMEOUT * 10, detail=cluster.logs)
    exits = [
        e.payload
        for e in await store.read_stream(trial_stream(trial_id))
        if e.type == "TrialExited"
    ]
    assert len(exits) == 1 and exits[0]["outcome"] == "lost"
    assert "no heartbeat" in exits[0]["message"]


async def test_two_ranks_under_torchrun_report_once(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """Two ranks under torchrun make one trial and one run, and each step is reported once."""
    done = run_ranks(cluster, tmp_path, "trial-d")
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert len(outputs) == 2 and len({o["trial_id"] for o in outputs}) == 1
    trial_id = outputs[0]["trial_id"]
    events = await store.read_stream(trial_stream(trial_id))
    assert [e.type for e in events].count("SlotsAllocated") == 1
    steps = [e.payload["steps_completed"] for e in events if e.type == "WorkloadCompleted"]
    assert sorted(steps) == [1, 2, 3]
    assert await trial_state(store, trial_id) == lifecycle.COMPLETED
    requested = [
        e
        for e in await store.read_all()
        if e.type == "TrialRequested" and e.payload.get("external_id") == "trial-d"
    ]
    assert len(requested) == 1


async def test_another_user_can_neither_see_nor_resume_the_run(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """Bob gets 403 on the admin's unmanaged experiment and trial, never sees it listed,
    may not close its run with his token, gets 400 for an overlong or NUL-bearing external id, and
    the same external ids make him his own experiment."""
    code, mine, err = run(cluster, tmp_path, "trial-x")
    assert code == 0, err
    await cluster.request("POST", "/users", {"username": "bob", "password": "bob-password-0123"})
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{cluster.api_url}/api/v1/auth/login",
            json={"username": "bob", "password": "bob-password-0123"},
        ) as resp:
            bob = {"Authorization": f"Bearer {(await resp.json())['token']}"}
        for path in (f"/experiments/{mine['experiment_id']}", f"/trials/{mine['trial_id']}"):
            async with http.get(f"{cluster.api_url}/api/v1{path}", headers=bob) as resp:
                assert resp.status == 403, path
        async with http.post(
            f"{cluster.api_url}/api/v1/unmanaged/runs/close", json={}, headers=bob
        ) as resp:
            assert resp.status == 403
        for hostile in ({"external_experiment_id": "x" * 300}, {"external_trial_id": "a\x00b"}):
            body = {
                "external_experiment_id": "e",
                "external_trial_id": "t",
                "config": {"searcher": {"name": "single", "metric": "m"}},
                **hostile,
            }
            async with http.post(
                f"{cluster.api_url}/api/v1/unmanaged/trials", json=body, headers=bob
            ) as resp:
                assert resp.status == 400, hostile
        async with http.get(f"{cluster.api_url}/api/v1/experiments", headers=bob) as resp:
            assert all(e["id"] != mine["experiment_id"] for e in (await resp.json())["experiments"])
    code, theirs, err = run(cluster, tmp_path, "trial-x", user="bob", password="bob-password-0123")
    assert code == 0, err
    assert theirs["experiment_id"] != mine["experiment_id"]
    assert theirs["trial_id"] != mine["trial_id"] and theirs["latest"] is None
