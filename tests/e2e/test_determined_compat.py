"""The Determined compatibility suite: every config of ``examples/determined_compat`` (Core API
scripts written as Determined's docs write them, ``import determined as det`` unchanged) runs at
once on one embedded cluster to COMPLETED, and each shows what it is for."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from cairn.local.servers import ServerProcess
from events.domain.check import check_log
from events.domain.config import parse_config
from events.domain.names import trial_stream
from events.log.store import EventStore
from tests.e2e.harness import Cluster, code_tarball, experiment_state, trial_ids, wait_for
from tests.helpers import ROOT

COMPAT = ROOT / "examples" / "determined_compat"
ENDED = ("COMPLETED", "ERROR", "CANCELED")
log = structlog.get_logger("tests.compat")


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Every service and one 8-slot agent whose default checkpoint storage is under tmp_path."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_services("--agent-timeout", "15", timeout=30)
    c.start_agent("agent-a", 8, "--checkpoint-root", str(tmp_path / "default-storage"))
    try:
        await c.login()
        yield c
    finally:
        c.stop()


class Trials:
    """The events of one experiment's trials, read once it has ended."""

    def __init__(self, events: dict[int, list[Any]]) -> None:
        self.events = events

    @classmethod
    async def read(cls, store: EventStore, experiment_id: int) -> Trials:
        ids = await trial_ids(store, experiment_id)
        return cls({t: list(await store.read_stream(trial_stream(t))) for t in ids})

    def payloads(self, trial_id: int, event_type: str) -> list[dict[str, Any]]:
        return [e.payload for e in self.events[trial_id] if e.type == event_type]

    def steps(self, trial_id: int, event_type: str) -> list[int]:
        return [int(p["steps_completed"]) for p in self.payloads(trial_id, event_type)]

    def only(self) -> int:
        assert len(self.events) == 1, sorted(self.events)
        return next(iter(self.events))


async def submit(cluster: Cluster, config: dict[str, Any]) -> tuple[int, list[str]]:
    """Submits ``config`` with the whole directory as its code; the id and the warned paths."""
    data = await cluster.request(
        "POST",
        "/experiments",
        {"config": config, "code": code_tarball(COMPAT), "activate": True},
    )
    return int(data["id"]), [w["path"] for w in data.get("warnings", [])]


async def hparams_of(store: EventStore, experiment_id: int, trial_id: int) -> dict[str, Any]:
    """The hyperparameters the searcher gave ``trial_id``."""
    stream = await store.read_stream(f"experiment-{experiment_id}")
    (hparams,) = [
        e.payload["hparams"]
        for e in stream
        if e.type == "TrialRequested" and e.payload["trial_id"] == trial_id
    ]
    return dict(hparams)


async def trial_logs(cluster: Cluster, store: EventStore, experiment_id: int) -> str:
    lines = []
    for trial_id in await trial_ids(store, experiment_id):
        body = await cluster.request("GET", f"/trials/{trial_id}/logs")
        lines += [f"[trial {trial_id}] {entry['line']}" for entry in body["logs"]]
    return "\n".join(lines)


@pytest.mark.timeout(300)
async def test_every_compat_script_runs_to_completed_and_shows_its_fact(
    cluster: Cluster, store: EventStore, tmp_path: Path
) -> None:
    """All fifteen Determined-style experiments run concurrently to COMPLETED; each shows its
    fact: metrics, resume after a pause and after a crash, a search continued after one of its
    trials was killed, random/grid/ASHA searches, searcher operations, cluster info (owner and
    cluster id included), InvalidHP, warnings for every ignored field, shared_fs checkpoints,
    status and best validation, TensorBoard and profiler, core_v2 in a managed trial."""
    for script in COMPAT.glob("*.py"):
        text = script.read_text()
        assert "import determined as det" in text, f"{script.name}: imports Determined's package"
        assert "cairn" not in text, f"{script.name}: says nothing of cairn"
    began = time.monotonic()
    configs = {p.stem: yaml.safe_load(p.read_text()) for p in sorted(COMPAT.glob("*.yaml"))}
    assert len(configs) >= 12
    shared = tmp_path / "shared"
    configs["shared_fs"]["checkpoint_storage"]["host_path"] = str(shared)
    exps: dict[str, int] = {}
    warned: dict[str, list[str]] = {}
    for name, config in configs.items():
        exps[name], warned[name] = await submit(cluster, config)

    # Pause the pause_resume experiment once its first run has checkpointed (the script holds
    # there until it is preempted), wait until that run has exited, then activate it again.
    # Kill the holding trial of continue_search at the same point.
    paused, searched = exps["pause_resume"], exps["continue_search"]
    held: dict[int, int] = {}

    async def checkpointed() -> bool:
        for exp in (paused, searched):
            for trial_id in await trial_ids(store, exp):
                stream = await store.read_stream(trial_stream(trial_id))
                hparams = requested[trial_id] = await hparams_of(store, exp, trial_id)
                if hparams.get("hold_at") == 2 and any(e.type == "CheckpointSaved" for e in stream):
                    held[exp] = trial_id
        return len(held) == 2

    requested: dict[int, dict[str, Any]] = {}
    await wait_for(cluster, checkpointed, timeout=120)
    await cluster.action(paused, "pause")
    await cluster.request("POST", f"/trials/{held[searched]}/kill", {})

    async def run_exited() -> bool:
        stream = await store.read_stream(trial_stream(held[paused]))
        return any(e.type == "TrialExited" for e in stream)

    await wait_for(cluster, run_exited, timeout=60)
    assert await experiment_state(store, paused) == "PAUSED"
    await cluster.action(paused, "activate")

    async def search_ended() -> bool:
        return await experiment_state(store, searched) in ENDED

    await wait_for(cluster, search_ended, timeout=120)
    assert await experiment_state(store, searched) == "COMPLETED"
    continued = await cluster.request("POST", f"/experiments/{searched}/continue", {})
    assert continued["trial_ids"] == [held[searched]], "only the killed trial trains on"

    async def all_ended() -> bool:
        return all([await experiment_state(store, e) in ENDED for e in exps.values()])

    await wait_for(cluster, all_ended, timeout=200)
    log.info("compat suite ran", seconds=round(time.monotonic() - began, 1))
    for name, exp in exps.items():
        state = await experiment_state(store, exp)
        if state != "COMPLETED":
            logs = await trial_logs(cluster, store, exp)
            raise AssertionError(f"{name} (experiment {exp}) is {state}:\n{logs}")
    trials = {name: await Trials.read(store, exp) for name, exp in exps.items()}

    # metrics: every training report and every second one as validation.
    t = trials["metrics"].only()
    assert trials["metrics"].steps(t, "WorkloadCompleted") == [1, 2, 3, 4]
    validations = trials["metrics"].payloads(t, "ValidationReported")
    assert [(v["steps_completed"], v["metrics"]) for v in validations] == [
        (2, {"validation_x": 2.0}),
        (4, {"validation_x": 4.0}),
    ]

    # pause_resume: the second run resumed from the checkpoint the first saved before the pause.
    t = trials["pause_resume"].only()
    assert t == held[paused]
    saved = trials["pause_resume"].payloads(t, "CheckpointSaved")
    assert [(c["run_id"], c["steps_completed"]) for c in saved] == [(1, 2), (2, 4), (2, 6)]
    assert saved[0]["metadata"]["resumed_from"] is None
    assert {c["metadata"]["resumed_from"] for c in saved[1:]} == {saved[0]["uuid"]}
    assert trials["pause_resume"].steps(t, "WorkloadCompleted")[-4:] == [3, 4, 5, 6]

    # crash_resume: the first run crashed after its step-4 checkpoint; the restart resumed there.
    t = trials["crash_resume"].only()
    exits = trials["crash_resume"].payloads(t, "TrialExited")
    assert [(x["run_id"], x["exit_code"]) for x in exits] == [(1, 1), (2, 0)]
    assert len(trials["crash_resume"].payloads(t, "TrialRestarted")) == 1
    saved = trials["crash_resume"].payloads(t, "CheckpointSaved")
    assert [(c["run_id"], c["steps_completed"]) for c in saved] == [(1, 2), (1, 4), (2, 6)]
    assert saved[2]["metadata"]["resumed_from"] == saved[1]["uuid"]

    # continue_search: the killed trial was CANCELED, then continued from its step-2
    # checkpoint to the end; the trial that completed was left alone.
    search = trials["continue_search"]
    t = held[searched]
    saved = search.payloads(t, "CheckpointSaved")
    assert [(c["run_id"], c["steps_completed"]) for c in saved] == [(1, 2), (2, 4), (2, 6)]
    assert {c["metadata"]["resumed_from"] for c in saved[1:]} == {saved[0]["uuid"]}
    states = [p["state"] for p in search.payloads(t, "TrialStateChanged")]
    assert "CANCELED" in states and states[-1] == "COMPLETED"
    (other,) = [trial for trial in search.events if trial != t]
    assert len(search.payloads(other, "TrialExited")) == 1

    # random and grid: the searches asked for their trials, and each validated.
    assert len(trials["random"].events) == 2
    grid = trials["grid"]
    assert sorted(
        p["hparams"]["learning_rate"]
        for e in await store.read_stream(f"experiment-{exps['grid']}")
        if e.type == "TrialRequested"
        for p in [e.payload]
    ) == [0.01, 0.1]
    for search in ("random", "grid"):
        for t in trials[search].events:
            assert trials[search].steps(t, "ValidationReported") == [2, 4], search
    assert len(grid.events) == 2

    # adaptive_asha: three trials, each validated at the first rung; the best reached the end.
    asha = trials["adaptive_asha"]
    assert len(asha.events) == 3
    assert all(4 in asha.steps(t, "ValidationReported") for t in asha.events)
    assert any(asha.steps(t, "ValidationReported")[-1] == 8 for t in asha.events)

    # searcher_ops: each trial trained through its one operation and reported it completed.
    for t in trials["searcher_ops"].events:
        assert trials["searcher_ops"].steps(t, "WorkloadCompleted") == [1, 2, 3, 4, 5, 6]
        assert trials["searcher_ops"].steps(t, "ValidationReported") == [6]
        operation = await cluster.request("GET", f"/trials/{t}/searcher/operation")
        assert operation["completed"]

    # cluster_info: what det.get_cluster_info() said, kept in the checkpoint's metadata.
    t = trials["cluster_info"].only()
    (seen,) = [c["metadata"] for c in trials["cluster_info"].payloads(t, "CheckpointSaved")]
    master = await cluster.request("GET", "/master")
    assert seen["user"] == "admin"
    assert seen["cluster_id"] == master["cluster_id"] != ""
    assert (seen["trial_id"], seen["experiment_id"]) == (t, exps["cluster_info"])
    assert (seen["task_type"], seen["task_id"], seen["trial_run_id"]) == ("TRIAL", str(t), 1)
    assert seen["hparams"] == {"width": 8, "optimizer": {"name": "sgd", "momentum": 0.9}}
    assert seen["user_data"] == configs["cluster_info"]["data"]
    assert (seen["container_rank"], len(seen["slot_ids"])) == (0, 1)
    assert seen["latest_checkpoint"] is None and seen["master_url"] == cluster.api_url

    # invalid_hp: the odd width was refused as an invalid hyperparameter, the even one trained.
    invalid = trials["invalid_hp"]
    reasons = {
        t: [p["reason"] for p in invalid.payloads(t, "TrialEarlyExited")] for t in invalid.events
    }
    assert sorted(reasons.values()) == [[], ["invalid_hp"]]

    # ignored_fields: one warning per ignored path, exactly what the config parser names.
    expected = [w.path for w in parse_config(yaml.safe_dump(configs["ignored_fields"])).warnings]
    assert warned["ignored_fields"] == expected and len(expected) >= 28
    assert "environment.registry_auth" in expected and "slurm.gpu_type" in expected
    assert all(warned[n] == [] for n in configs if n != "ignored_fields")
    t = trials["ignored_fields"].only()
    assert trials["ignored_fields"].steps(t, "ValidationReported") == [2]

    # shared_fs: the checkpoint is a directory under host_path/storage_path.
    t = trials["shared_fs"].only()
    (saved_fs,) = trials["shared_fs"].payloads(t, "CheckpointSaved")
    state_file = shared / "determined-checkpoint" / saved_fs["uuid"] / "state.json"
    assert state_file.read_text() == '{"step": 2, "x": 3}'

    # status_best: both trials show their last status and alerted with the best so far.
    for t in trials["status_best"].events:
        detail = await cluster.request("GET", f"/trials/{t}")
        assert detail["status"] == "done"
        assert [a["title"] for a in detail["alerts"]] == ["best so far"]

    # tensorboard_profiler: system metrics were reported and the TensorBoard file uploaded.
    t = trials["tensorboard_profiler"].only()

    system = [
        m for m in trials["tensorboard_profiler"].payloads(t, "MetricsReported")
        if m["group"] == "system"
    ]  # fmt: skip
    assert system and all("cpu_util_pct" in m["metrics"] for m in system)
    tensorboard = (
        tmp_path / "default-storage" / "tensorboard" / "experiment"
        / str(exps["tensorboard_profiler"]) / "trial" / str(t)
    )  # fmt: skip
    assert (tensorboard / "notes.txt").read_text() == "trained to x=4.0"

    # core_v2_managed: core_v2 in a trial ignores its Config and reports to the trial.
    t = trials["core_v2_managed"].only()
    assert trials["core_v2_managed"].steps(t, "WorkloadCompleted") == [1, 2, 3]
    (saved_v2,) = trials["core_v2_managed"].payloads(t, "CheckpointSaved")
    assert saved_v2["metadata"]["trial_id"] == t

    assert await check_log(store) == []
