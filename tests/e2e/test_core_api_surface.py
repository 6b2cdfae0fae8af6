"""A Determined <= 0.37 Core API script using the whole surface runs to COMPLETED on a real
cluster: searcher operations, status, best validation, TensorBoard files, sharded checkpoints
with selectors across two real ranks, and alerts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from cairn.local.servers import ServerProcess
from events.domain.names import trial_stream
from events.log.store import EventStore
from tests.e2e.harness import Cluster, events_of, experiment_state, trial_ids, wait_for
from tests.helpers import ROOT

SEARCHER_OPS = ROOT / "examples" / "searcher_ops"


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Every service and one 2-slot agent, as processes."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=2, agent_timeout=5.0)
    try:
        await c.login()
        yield c
    finally:
        c.stop()


def describe(cluster: Cluster, trial_id: int) -> str:
    """What ``cairn trial describe`` prints for the trial."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(
        PYTHONPATH=str(ROOT),
        CAIRN_HOME=str(cluster.workdir / "cli-home"),
        CAIRN_MASTER=cluster.api_url,
        CAIRN_USER="admin",
        CAIRN_PASSWORD=cluster.admin_password,
    )
    done = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "trial", "describe", str(trial_id)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of one scalar tag, as TensorBoard reads the directory."""
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


@pytest.mark.timeout(420)
async def test_determined_037_script_uses_the_whole_core_api_and_completes(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """Two 2-rank trials of a grid search each train through one searcher op of max_length,
    validate, read the experiment's best validation from the cluster (the later trial sees the
    better of both), raise an alert, store one sharded checkpoint merged from both ranks (scratch
    files left out by the selector) and download their own shard back; their TensorBoard files
    and status are in storage and in the trial record; the experiment COMPLETES."""
    storage = tmp_path / "ckpt"
    config = yaml.safe_load((SEARCHER_OPS / "config.yaml").read_text())
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(storage)}
    exp = await cluster.submit(config, SEARCHER_OPS)

    async def ended() -> bool:
        return await experiment_state(store, exp) in ("COMPLETED", "ERROR", "CANCELED")

    await wait_for(cluster, ended, timeout=360)
    if await experiment_state(store, exp) != "COMPLETED":
        logs = []
        for trial_id in await trial_ids(store, exp):
            body = await cluster.request("GET", f"/trials/{trial_id}/logs")
            logs += [entry["line"] for entry in body["logs"]]
        raise AssertionError(f"experiment {exp} did not complete:\n" + "\n".join(logs))

    requested = {
        e.payload["hparams"]["increment"]: e.payload["trial_id"]
        for e in await events_of(store, "TrialRequested")
        if e.payload["experiment_id"] == exp
    }
    losses = {trial: 1 / (1 + 20 * inc) for inc, trial in requested.items()}
    best = await cluster.request(
        "GET", f"/experiments/{exp}/searcher/best_searcher_validation_metric"
    )
    assert best["metric"] == pytest.approx(min(losses.values()))
    assert best["trial_id"] == requested[3]

    seen_best: list[float] = []
    for trial, loss in losses.items():
        events = await store.read_stream(trial_stream(trial))
        validations = [e.payload for e in events if e.type == "ValidationReported"]
        assert [(v["steps_completed"], v["metrics"]["loss"]) for v in validations] == [
            (20, pytest.approx(loss))
        ], "one op of max_length 20, its metric reported once"
        training = [e.payload["steps_completed"] for e in events if e.type == "WorkloadCompleted"]
        assert training == [5, 10, 15, 20], "only the chief reports"

        alerts = [e.payload for e in events if e.type == "TrialAlerted"]
        assert [(a["title"], a["level"]) for a in alerts] == [("validated", "info")]
        match = re.fullmatch(r"loss=(\S+) best=(\S+)", alerts[0]["description"])
        assert match is not None and float(match.group(1)) == pytest.approx(loss)
        seen_best.append(float(match.group(2)))

        saved = [e.payload for e in events if e.type == "CheckpointSaved"]
        assert len(saved) == 1, "the chief alone reports the sharded checkpoint"
        assert sorted(saved[0]["resources"]) == ["metadata.json", "shard0.txt", "shard1.txt"]
        assert saved[0]["metadata"] == {"steps_completed": 20, "shard1": "present"}
        folder = storage / saved[0]["uuid"]
        inc = 1 if loss > min(losses.values()) else 3
        assert (folder / "shard1.txt").read_text() == f"rank 1 counter {20 * inc}"

        detail = await cluster.request("GET", f"/trials/{trial}")
        assert detail["status"] == "done"
        assert [a["title"] for a in detail["alerts"]] == ["validated"]
        shown = describe(cluster, trial)
        assert re.search(r"^status:\s+done$", shown, re.M), shown
        assert re.search(r"^validated\s+info\s+loss=", shown, re.M), shown
        operation = await cluster.request("GET", f"/trials/{trial}/searcher/operation")
        assert operation["completed"], "a finished trial has no operation left"

        tensorboard = storage / "tensorboard" / "experiment" / str(exp) / "trial" / str(trial)
        assert scalars(tensorboard, "training/loss") == [
            (steps, round(1 / (1 + steps * inc), 6)) for steps in (5, 10, 15, 20)
        ]
        assert scalars(tensorboard, "validation/loss") == [(20, round(loss, 6))]
        notes = {p.name: p.read_text() for p in tensorboard.glob("rank*-note.txt")}
        assert notes == {f"rank{r}-note.txt": f"rank {r} saved {saved[0]['uuid']}" for r in (0, 1)}
    assert min(losses.values()) in [pytest.approx(b) for b in seen_best], (
        "the trial that ran second saw the better loss of both"
    )
