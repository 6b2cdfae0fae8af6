"""The tracker over a real log: projections of a realistic experiment, an exact rebuild, and
checkpoint GC on real directories (policy GC at the end, everything on deletion)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from cairn.local.servers import ServerProcess
from events.domain.checkpoint_storage import MARKER_FILE, marker_bytes
from events.domain.names import allocation_id, trial_stream
from events.domain.types import (
    AgentLost,
    AgentRegistered,
    CheckpointSaved,
    ExperimentArchived,
    ExperimentStateChanged,
    ExperimentSubmitted,
    MetricsReported,
    SlotsAllocated,
    SlotsDisabled,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialRestarted,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
    WorkloadCompleted,
)
from events.domain.types.agent import Slot
from events.log.envelope import Event, RecordedEvent
from events.log.store import EventStore
from services.tracker.projections import rebuild
from services.tracker.schema import PRIMARY_KEYS, TABLES
from services.tracker.service import catch_up
from tests.helpers import ROOT, spawn, wait_for_line, wait_until
from tests.integration.test_api_support import TEST_STORAGE


def config(root: Path, **storage: Any) -> dict[str, Any]:
    """A random-search config with shared_fs storage under ``root``."""
    return {
        "name": "mnist",
        "description": "digits",
        "labels": ["vision", "baseline"],
        "entrypoint": "python3 train.py",
        "hyperparameters": {"lr": {"type": "const", "val": 0.1}},
        "searcher": {"name": "random", "metric": "loss", "max_trials": 2},
        "checkpoint_storage": {"type": "shared_fs", "host_path": str(root), **storage},
    }


class Log:
    """Appends facts the way the services would, remembering when each was recorded."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.at: dict[str, datetime] = {}

    async def add(self, stream: str, *events: Event, mark: str = "") -> list[RecordedEvent]:
        recorded = await self.store.append(stream, list(events))
        if mark:
            self.at[mark] = recorded[0].recorded_at
        return recorded

    async def trial(self, trial_id: int, *events: Event, mark: str = "") -> None:
        await self.add(trial_stream(trial_id), *events, mark=mark)

    async def metrics(
        self, trial_id: int, run: int, training: tuple[int, ...], validation: dict[int, float]
    ) -> None:
        for steps in training:
            await self.trial(
                trial_id,
                WorkloadCompleted(
                    trial_id=trial_id,
                    run_id=run,
                    steps_completed=steps,
                    metrics={"loss": 1.0 / steps},
                ),
            )
        for steps, loss in validation.items():
            await self.trial(
                trial_id,
                ValidationReported(
                    trial_id=trial_id, run_id=run, steps_completed=steps, metrics={"loss": loss}
                ),
            )

    async def checkpoint(self, trial_id: int, run: int, uuid: str, steps: int) -> None:
        await self.trial(
            trial_id,
            CheckpointSaved(
                trial_id=trial_id,
                run_id=run,
                uuid=uuid,
                steps_completed=steps,
                resources={"model.pt": 10},
                metadata={"steps_completed": steps},
            ),
        )

    async def run(
        self, trial_id: int, run: int, agent: str, slot: str, restored: str | None = None
    ) -> None:
        allocation = allocation_id(trial_id, run)
        await self.trial(
            trial_id,
            SlotsAllocated(
                trial_id=trial_id, allocation_id=allocation, placements={agent: [slot]}, run_id=run
            ),
        )
        await self.trial(
            trial_id,
            TrialStarted(
                trial_id=trial_id,
                allocation_id=allocation,
                run_id=run,
                agent_id=agent,
                restored_checkpoint=restored,
            ),
            mark=f"started {allocation}",
        )

    async def exit(
        self, trial_id: int, run: int, agent: str, slot: str, outcome: str, code: int
    ) -> None:
        allocation = allocation_id(trial_id, run)
        await self.trial(
            trial_id,
            TrialExited(
                trial_id=trial_id,
                run_id=run,
                allocation_id=allocation,
                outcome=outcome,
                exit_code=code,
            ),  # type: ignore[arg-type]
            SlotsReleased(trial_id=trial_id, allocation_id=allocation, placements={agent: [slot]}),
            mark=f"exited {allocation}",
        )


async def experiment(
    log: Log, experiment_id: int, root: Path, owner: str = "alice", **storage: Any
) -> None:
    await log.add(
        f"experiment-{experiment_id}",
        ExperimentSubmitted(
            experiment_id=experiment_id, config=config(root, **storage), owner=owner
        ),
        mark=f"submitted {experiment_id}",
    )


async def request(log: Log, trial_id: int) -> None:
    """Test trial ids read ``<experiment><n>``: 11 is experiment 1's first trial."""
    experiment_id = trial_id // 10
    await log.add(
        f"experiment-{experiment_id}",
        TrialRequested(
            experiment_id=experiment_id,
            trial_id=trial_id,
            seq=trial_id % 10,
            request_id=f"r{trial_id}",
            hparams={"lr": 0.1},
            trial_seed=7,
        ),
        mark=f"requested {trial_id}",
    )


async def finish(log: Log, experiment_id: int) -> None:
    stream = f"experiment-{experiment_id}"
    await log.add(
        stream, ExperimentStateChanged(experiment_id=experiment_id, state="STOPPING_COMPLETED")
    )
    await log.add(
        stream,
        ExperimentStateChanged(experiment_id=experiment_id, state="COMPLETED"),
        mark=f"completed {experiment_id}",
    )


async def drive(store: EventStore, root: Path) -> Log:
    """Experiment 1: two trials, a failed run restarted from c1 (metric rollback), checkpoints
    with early and late validations, a drained slot, a lost agent; experiment 2 warm-starts from
    c1. Stops before the trials end, so the slots are still allocated."""
    log = Log(store)
    slots = [Slot(slot_id="0"), Slot(slot_id="1", device="cuda", name="A100")]
    await log.add("agent-a1", AgentRegistered(agent_id="a1", slots=slots, hostname="h1"), mark="a1")
    await log.add(
        "agent-a2", AgentRegistered(agent_id="a2", slots=[Slot(slot_id="0")], hostname="h2")
    )
    await experiment(log, 1, root)
    await request(log, 11)
    await request(log, 12)
    await log.run(11, 1, "a1", "0")
    await log.run(12, 1, "a1", "1")
    # Trial 1.1, run 1: c1 at 20 after its validation, c2 at 30 before its validation.
    await log.metrics(11, 1, (10, 20, 30), {20: 0.5})
    await log.checkpoint(11, 1, "c1", 20)
    await log.checkpoint(11, 1, "c2", 30)
    await log.metrics(11, 1, (), {30: 0.4})
    await log.exit(11, 1, "a1", "0", "failed", 1)
    await log.trial(11, TrialRestarted(trial_id=11, restarts=1, latest_checkpoint="c1"))
    # Run 2 resumes from c1 (steps 20): its report at 25 archives run 1's rows beyond 25.
    await log.run(11, 2, "a2", "0", restored="c1")
    await log.metrics(11, 2, (25, 40), {40: 0.3})
    await log.checkpoint(11, 2, "c3", 40)
    # Trial 1.2: c6 (no validation), c4 (validated), c5 (latest, no validation).
    await log.checkpoint(12, 1, "c6", 5)
    await log.metrics(12, 1, (10,), {10: 0.6})
    await log.checkpoint(12, 1, "c4", 10)
    await log.checkpoint(12, 1, "c5", 20)
    await log.trial(
        12,
        MetricsReported(
            trial_id=12,
            run_id=1,
            group="inference",
            steps_completed=20,
            metrics={"latency": 3.5},
        ),
    )
    await log.add(
        "agent-a1", SlotsDisabled(agent_id="a1", slot_ids=["1"], drain=True, actor="admin")
    )
    # Experiment 2 warm-starts a trial from experiment 1's c1.
    await experiment(log, 2, root, owner="bob")
    await request(log, 21)
    await log.run(21, 1, "a1", "0", restored="c1")
    return log


async def finish_experiment_1(log: Log) -> None:
    await log.exit(11, 2, "a2", "0", "completed", 0)
    await log.exit(12, 1, "a1", "1", "completed", 0)
    for trial_id in (11, 12):
        await log.trial(
            trial_id,
            TrialStateChanged(trial_id=trial_id, state="COMPLETED"),
            mark=f"ended {trial_id}",
        )
    await finish(log, 1)
    await log.add("experiment-1", ExperimentArchived(experiment_id=1, archived=True, actor="alice"))
    await log.add("agent-a2", AgentLost(agent_id="a2"), mark="lost a2")


async def snapshot(store: EventStore) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for table in TABLES:
        rows = await store.fetch(f"SELECT * FROM {table} ORDER BY {', '.join(PRIMARY_KEYS[table])}")
        out[table] = [dict(r) for r in rows]
    return out


async def row(store: EventStore, sql: str, *args: Any) -> dict[str, Any]:
    found = await store.fetchrow(sql, *args)
    assert found is not None, sql
    return dict(found)


async def of_type(store: EventStore, stream: str, type_: str) -> list[dict[str, Any]]:
    return [e.payload for e in await store.read_stream(stream) if e.type == type_]


def make_dirs(root: Path, *uuids: str) -> None:
    """Checkpoint directories as the Core API leaves them (a file and cairn's marker)."""
    for uuid in uuids:
        (root / uuid).mkdir(parents=True)
        (root / uuid / "model.pt").write_bytes(b"0123456789")
        (root / uuid / MARKER_FILE).write_bytes(marker_bytes(uuid))


async def test_projections_follow_a_realistic_log_and_rebuild_exactly(
    store: EventStore, tmp_path: Path
) -> None:
    """Every tr_* table reflects the log's rules, and a rebuild from position 0 equals the live tables."""
    root = tmp_path / "ckpt"
    log = await drive(store, root)
    await catch_up(store, checkpoint_root=tmp_path / "default", storage_policy=TEST_STORAGE)

    slots = await store.fetch(
        "SELECT agent_id, slot_id, device, name, enabled, draining, allocation_id FROM tr_slots ORDER BY 1, 2"
    )
    assert [tuple(r) for r in slots] == [
        ("a1", "0", "cpu", "", True, False, "21.1"),
        ("a1", "1", "cuda", "A100", False, True, "12.1"),
        ("a2", "0", "cpu", "", True, False, "11.2"),
    ]
    running = await row(store, "SELECT * FROM tr_allocations WHERE allocation_id = '11.2'")
    assert (running["state"], running["agent_id"], running["started_at"]) == (
        "RUNNING",
        "a2",
        log.at["started 11.2"],
    )

    await finish_experiment_1(log)
    await catch_up(store, checkpoint_root=tmp_path / "default", storage_policy=TEST_STORAGE)

    exp = await row(store, "SELECT * FROM tr_experiments WHERE experiment_id = 1")
    assert exp | {"config": None} == {
        "experiment_id": 1,
        "name": "mnist",
        "description": "digits",
        "labels": ["vision", "baseline"],
        "owner": "alice",
        "state": "COMPLETED",
        "archived": True,
        "searcher_name": "random",
        "searcher_metric": "loss",
        "smaller_is_better": True,
        "max_trials": 2,
        "config": None,
        "code_ref": None,
        "resource_pool": "default",
        "num_trials": 2,
        "submitted_at": log.at["submitted 1"],
        "ended_at": log.at["completed 1"],
        "best_trial_id": 11,
        "best_metric": 0.3,
        "position": exp["position"],
        "unmanaged": False,
        "project_id": 1,
    }
    assert exp["config"]["searcher"]["metric"] == "loss"
    trial = await row(store, "SELECT * FROM tr_trials WHERE trial_id = 11")
    assert trial == {
        "trial_id": 11,
        "experiment_id": 1,
        "seq": 1,
        "state": "COMPLETED",
        "hparams": {"lr": 0.1},
        "trial_seed": 7,
        "run_id": 2,
        "restarts": 1,
        "steps_completed": 40,
        "latest_checkpoint": "c3",
        "best_metric": 0.3,
        "latest_validation": {"run_id": 2, "steps_completed": 40, "metrics": {"loss": 0.3}},
        "requested_at": log.at["requested 11"],
        "started_at": log.at["started 11.1"],
        "ended_at": log.at["ended 11"],
    }
    archived = await store.fetch(
        'SELECT run_id, "group", steps_completed FROM tr_metrics WHERE archived ORDER BY 2, 3'
    )
    assert [tuple(r) for r in archived] == [(1, "training", 30), (1, "validation", 30)]
    groups = await store.fetch(
        'SELECT DISTINCT "group" FROM tr_metrics WHERE trial_id = 12 ORDER BY 1'
    )
    assert [r[0] for r in groups] == ["inference", "training", "validation"]
    checkpoints = {
        r["uuid"]: r
        for r in await store.fetch(
            "SELECT uuid, state, validation, searcher_metric FROM tr_checkpoints"
        )
    }
    assert checkpoints["c2"]["validation"] == {
        "run_id": 1,
        "steps_completed": 30,
        "metrics": {"loss": 0.4},
    }
    assert checkpoints["c1"]["searcher_metric"] == 0.5  # validated before it was saved
    assert checkpoints["c5"]["validation"] is None
    failed = await row(store, "SELECT * FROM tr_allocations WHERE allocation_id = '11.1'")
    assert (failed["state"], failed["outcome"], failed["exit_code"], failed["ended_at"]) == (
        "TERMINATED",
        "failed",
        1,
        log.at["exited 11.1"],
    )
    released = await store.fetch(
        "SELECT slot_id FROM tr_slots WHERE allocation_id IS NULL ORDER BY agent_id, slot_id"
    )
    assert len(released) == 2  # only 2.1.1 still holds a slot
    agent = await row(store, "SELECT * FROM tr_agents WHERE agent_id = 'a2'")
    assert (agent["state"], agent["lost_at"]) == ("lost", log.at["lost a2"])

    live = await snapshot(store)
    applied = await rebuild(store)
    assert applied > 40
    assert await snapshot(store) == live
    assert await store.checkpoint("tracker-projections") == await store.head()


async def test_gc_keeps_the_policy_set_and_deletion_removes_everything(
    store: EventStore, tmp_path: Path
) -> None:
    """GC at completion removes only the policy's doomed dirs, once; DELETING removes all and empties the projections."""
    root = tmp_path / "ckpt"
    make_dirs(root, "c1", "c2", "c3", "c4", "c5")  # c6 is already gone
    log = await drive(store, root)
    await finish_experiment_1(log)
    await catch_up(store, checkpoint_root=tmp_path / "default", storage_policy=TEST_STORAGE)

    # Trial 1.1: c3 is best and latest, c1 is experiment 2's warm start; c2 goes.
    # Trial 1.2: c4 is best, c5 latest; c6 (no validation, not latest) goes.
    assert sorted(p.name for p in root.iterdir()) == ["c1", "c3", "c4", "c5"]
    deleted = await of_type(store, "experiment-1", "CheckpointsDeleted")
    assert deleted == [
        {"experiment_id": 1, "uuids": ["c2", "c6"], "missing": ["c6"], "reason": "gc"}
    ]
    states = dict(
        await store.fetch("SELECT uuid, state FROM tr_checkpoints WHERE experiment_id = 1")
    )
    assert states == {
        "c1": "COMPLETED",
        "c2": "DELETED",
        "c3": "COMPLETED",
        "c4": "COMPLETED",
        "c5": "COMPLETED",
        "c6": "DELETED",
    }

    await catch_up(store, checkpoint_root=tmp_path / "default", storage_policy=TEST_STORAGE)
    assert len(await of_type(store, "experiment-1", "CheckpointsDeleted")) == 1

    await log.add(
        "experiment-1", ExperimentStateChanged(experiment_id=1, state="DELETING", actor="alice")
    )
    await catch_up(store, checkpoint_root=tmp_path / "default", storage_policy=TEST_STORAGE)
    assert list(root.iterdir()) == []
    tail = [(e.type, e.payload) for e in (await store.read_stream("experiment-1"))[-2:]]
    assert tail == [
        (
            "CheckpointsDeleted",
            {
                "experiment_id": 1,
                "uuids": ["c1", "c3", "c4", "c5"],
                "missing": [],
                "reason": "experiment deleted",
            },
        ),
        (
            "ExperimentStateChanged",
            {
                "experiment_id": 1,
                "state": "DELETED",
                "reason": "checkpoints deleted",
                "actor": "tracker",
            },
        ),
    ]
    for table in ("tr_experiments", "tr_trials", "tr_allocations", "tr_checkpoints", "tr_metrics"):
        assert await store.fetchval(f"SELECT count(*) FROM {table} WHERE experiment_id = 1") == 0, (
            table
        )
    for table in ("tr_experiments", "tr_trials", "tr_allocations"):
        assert await store.fetchval(f"SELECT count(*) FROM {table} WHERE experiment_id = 2") == 1, (
            table
        )
    assert await store.fetchval("SELECT count(*) FROM tr_slots WHERE allocation_id LIKE '1.%'") == 0


async def test_deletion_that_cannot_remove_a_checkpoint_is_delete_failed(
    store: EventStore, tmp_path: Path
) -> None:
    """A removal failing with something other than not-found leaves the experiment DELETE_FAILED with the error."""
    root = tmp_path / "not-a-dir"
    root.write_text("a file where the checkpoint root should be")
    log = Log(store)
    await experiment(log, 1, root)
    await request(log, 11)
    await log.checkpoint(11, 1, "c1", 10)
    await finish(log, 1)
    await log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="DELETING"))
    await catch_up(store, checkpoint_root=tmp_path / "default", storage_policy=TEST_STORAGE)
    last = (await store.read_stream("experiment-1"))[-1]
    assert (last.type, last.payload["state"], last.payload["actor"]) == (
        "ExperimentStateChanged",
        "DELETE_FAILED",
        "tracker",
    )
    assert "c1" in last.payload["reason"]
    state = await store.fetchval("SELECT state FROM tr_experiments WHERE experiment_id = 1")
    assert state == "DELETE_FAILED"
    assert root.is_file()


async def test_service_process_projects_collects_and_rebuilds(
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    service_env: Callable[..., dict[str, str]],
    tmp_path: Path,
) -> None:
    """python -m services.tracker projects and collects live (with the relay), and --rebuild exits 0."""
    root = tmp_path / "ckpt"
    make_dirs(root, "c1", "c2", "c3", "c4", "c5")
    cluster_config = tmp_path / "cluster.yaml"
    cluster_config.write_text(f"checkpoint_storage: {{allowed_roots: [{root}]}}\n")
    env = service_env(
        CAIRN_CHECKPOINT_ROOT=str(tmp_path / "default"),
        CAIRN_CLUSTER_CONFIG=str(cluster_config),
    )
    args = ("--db", db_url, "--nats", nats_server.url)
    relay = spawn("services.relay", *args, env=env)
    tracker = spawn("services.tracker", *args, env=env)
    try:
        await asyncio.to_thread(wait_for_line, tracker, "ready")
        log = await drive(store, root)
        await finish_experiment_1(log)

        async def collected() -> bool:
            head = await store.head()
            return bool(
                await of_type(store, "experiment-1", "CheckpointsDeleted")
                and await store.checkpoint("tracker-projections") >= head
            )

        await wait_until(collected, timeout=30)
        assert sorted(p.name for p in root.iterdir()) == ["c1", "c3", "c4", "c5"]
        state = await store.fetchval("SELECT state FROM tr_checkpoints WHERE uuid = 'c2'")
        assert state == "DELETED"
    finally:
        for proc in (tracker, relay):
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
    live = await snapshot(store)
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.tracker", "--db", db_url, "--rebuild"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert await snapshot(store) == live
