"""``import cairn as det`` as Determined's top-level package: the names training code uses, the
cluster info read from the trial environment, and a Determined-style script run off-cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cairn
import cairn.core
from tests.agent_specs import spec_answer

ROOT = Path(__file__).resolve().parents[2]
CORE_API = ROOT / "examples" / "core_api" / "train.py"


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Runs a Python subprocess off-cluster (no ``CAIRN_*`` or rank variables)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CAIRN_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def trial_env(**extra: str) -> dict[str, str]:
    """The environment an agent gives a one-slot trial process, plus ``extra``."""
    env = {
        "CAIRN_MASTER": "http://api.example:8080/",
        "CAIRN_TOKEN": "trial:7.2:abc",
        "CAIRN_EXPERIMENT_ID": "7",
        "CAIRN_TRIAL_ID": "72",
        "CAIRN_RUN_ID": "3",
        "CAIRN_ALLOCATION_ID": "72.3",
        "CAIRN_AGENT_ID": "gpu03",
        "CAIRN_SLOT_IDS": json.dumps(["GPU-aaaa", "GPU-bbbb"]),
        "CAIRN_HPARAMS": json.dumps({"lr": 0.01, "layers": {"n": 2}}),
        "CAIRN_TRIAL_SEED": "1234",
        "CAIRN_LATEST_CHECKPOINT": "c0ffee",
        "CAIRN_STEPS_COMPLETED": "40",
        "CAIRN_CHECKPOINT_DIR": "/shared/ckpt",
        "CAIRN_EXPERIMENT_CONFIG": json.dumps({"data": {"url": "s3://bucket/x"}}),
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb",
    }
    env.update(extra)
    return env


def test_import_cairn_exposes_determined_names_without_loading_the_core_api(
    tmp_path: Path,
) -> None:
    """``import cairn`` loads neither the Core API nor torch/numpy; ``det.core`` and the other
    Determined top-level names work right after it, with Determined's enum member names."""
    code = (
        "import sys, json\n"
        "import cairn as det\n"
        "loaded = sorted(m for m in ('cairn.core', 'torch', 'numpy') if m in sys.modules)\n"
        "core = det.core\n"
        "print(json.dumps({\n"
        "  'loaded_by_import': loaded,\n"
        "  'core': [callable(core.init), core.Context.__name__, core.DistributedContext.__name__,\n"
        "           core.DummyDistributedContext().get_size()],\n"
        "  'tensorboard': [m.name for m in core.TensorboardMode],\n"
        "  'download': [m.name for m in core.DownloadMode],\n"
        "  'info': det.get_cluster_info(),\n"
        "  'classes': [det.ClusterInfo is core.ClusterInfo, det.InvalidHP is core.InvalidHP,\n"
        "              det.TrialInfo is core.TrialInfo],\n"
        "  'log_format': det.LOG_FORMAT,\n"
        "}))\n"
    )
    result = run(["-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["loaded_by_import"] == []
    assert got["core"] == [True, "Context", "DistributedContext", 1]
    assert got["tensorboard"] == ["AUTO", "MANUAL"]
    assert got["download"] == ["LocalWorkersShareDownload", "NoSharedDownload"]
    assert got["info"] is None  # off-cluster, as in Determined
    assert got["classes"] == [True, True, True]
    assert got["log_format"] == cairn.LOG_FORMAT


def test_unknown_top_level_name_is_an_attribute_error() -> None:
    """A name cairn does not have fails like any missing module attribute."""
    with pytest.raises(AttributeError, match="no attribute 'Trial'"):
        _ = cairn.Trial


def test_cluster_info_carries_what_determined_s_does() -> None:
    """get_cluster_info() maps the agent's CAIRN_* environment onto Determined's ClusterInfo
    surface: trial ids, hparams, seed, user data, slots and GPUs, task and allocation ids,
    latest checkpoint, master URL, token, and a one-container layout."""
    info = cairn.get_cluster_info(trial_env(CAIRN_USER="alice", CAIRN_CLUSTER_ID="lab-1"))
    assert info is not None
    trial = info.trial
    assert (trial.trial_id, trial.experiment_id, trial.trial_seed) == (72, 7, 1234)
    assert (trial.run_id, trial.trial_run_id, trial.steps_completed) == (3, 3, 40)
    assert trial.hparams == {"lr": 0.01, "layers": {"n": 2}}
    assert trial.user_data == info.user_data == {"url": "s3://bucket/x"}
    assert info.master_url == "http://api.example:8080"
    assert info.session_token == info.token == "trial:7.2:abc"
    assert (info.task_type, info.task_id, info.allocation_id) == ("TRIAL", "72", "72.3")
    assert (info.user, info.cluster_id, info.agent_id) == ("alice", "lab-1", "gpu03")
    assert info.latest_checkpoint == "c0ffee"
    assert info.slot_ids == ["GPU-aaaa", "GPU-bbbb"] and info.num_slots == 2
    assert info.gpu_uuids == ["GPU-aaaa", "GPU-bbbb"] and info.num_gpus == 2
    assert info.container_addrs == ["127.0.0.1"]
    assert (info.container_rank, info.container_slot_counts) == (0, [2])


def test_cluster_info_defaults_for_a_cpu_trial_without_optional_variables() -> None:
    """Without a checkpoint, GPUs, user, cluster id or data section the fields are empty, not
    missing; CPU slot ids named in CUDA_VISIBLE_DEVICES by a user are not GPUs."""
    env = trial_env(
        CAIRN_LATEST_CHECKPOINT="",
        CAIRN_SLOT_IDS=json.dumps(["cpu-slot-0"]),
        CUDA_VISIBLE_DEVICES="0",
        CAIRN_EXPERIMENT_CONFIG="{}",
    )
    info = cairn.get_cluster_info(env)
    assert info is not None
    assert info.latest_checkpoint is None
    assert (info.gpu_uuids, info.num_gpus, info.num_slots) == ([], 0, 1)
    assert (info.user, info.cluster_id, info.user_data) == ("", "", {})


def test_cluster_info_describes_the_containers_of_a_multi_machine_run() -> None:
    """Rank variables give this container's rank and the per-container slot counts;
    CAIRN_CONTAINER_* variables, when an agent sets them, win."""
    derived = cairn.get_cluster_info(
        trial_env(RANK="3", LOCAL_RANK="1", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    )
    assert derived is not None
    assert (derived.container_rank, derived.container_slot_counts) == (1, [2, 2])
    assert derived.container_addrs == []  # not published: unknown, never guessed
    told = cairn.get_cluster_info(
        trial_env(
            RANK="3",
            WORLD_SIZE="4",
            LOCAL_WORLD_SIZE="2",
            CAIRN_CONTAINER_ADDRS=json.dumps(["10.0.0.1", "10.0.0.2"]),
            CAIRN_CONTAINER_RANK="1",
            CAIRN_CONTAINER_SLOT_COUNTS=json.dumps([2, 2]),
        )
    )
    assert told is not None
    assert told.container_addrs == ["10.0.0.1", "10.0.0.2"]
    assert (told.container_rank, told.container_slot_counts) == (1, [2, 2])


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CAIRN_HPARAMS", "{not json"),
        ("CAIRN_TRIAL_SEED", "seven"),
        ("CAIRN_CONTAINER_ADDRS", '"10.0.0.1"'),
    ],
)
def test_malformed_cluster_variable_is_named_in_the_error(name: str, value: str) -> None:
    """A malformed variable raises ValueError naming it, instead of a bare parse error."""
    with pytest.raises(ValueError, match=name):
        cairn.get_cluster_info(trial_env(**{name: value}))


def test_off_cluster_cluster_info_is_none() -> None:
    """Without the agent's variables there is no cluster info."""
    assert cairn.get_cluster_info({"CAIRN_USER": "alice", "PATH": "/bin"}) is None


def test_modes_are_checked_where_they_are_accepted(tmp_path: Path) -> None:
    """init() takes tensorboard_mode and restore_path/download take download_mode; a value
    that is not one of the enum's is rejected."""
    with cairn.core.init(
        checkpoint_storage=tmp_path, tensorboard_mode=cairn.core.TensorboardMode.MANUAL
    ) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 1}) as (path, uuid):
            (path / "w").write_text("w")
        mode = cairn.core.DownloadMode.NoSharedDownload
        with ctx.checkpoint.restore_path(uuid, download_mode=mode) as restored:
            assert (restored / "w").read_text() == "w"
        ctx.checkpoint.download(uuid, tmp_path / "copy", download_mode=mode)
        assert (tmp_path / "copy" / "w").read_text() == "w"
        with pytest.raises(ValueError), ctx.checkpoint.restore_path(uuid, "eager"):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError):
        cairn.core.init(checkpoint_storage=tmp_path, tensorboard_mode="sometimes")  # type: ignore[arg-type]


def _reports(stderr: str) -> list[tuple[str, dict[str, Any]]]:
    """The (kind, item) pairs the off-cluster reporter printed."""
    pattern = re.compile(r"^\[cairn\.core\] (\w+): (\{.*\})$", re.M)
    return [(kind, json.loads(body)) for kind, body in pattern.findall(stderr)]


def test_determined_style_script_runs_off_cluster(tmp_path: Path) -> None:
    """examples/core_api/train.py (import cairn as det, LOG_FORMAT logging, get_cluster_info(),
    ``with det.core.init()``) runs as ``python train.py``: it reports training and validation
    metrics, logs in LOG_FORMAT and saves a checkpoint with steps_completed."""
    result = run([str(CORE_API), "batches=20", "increment_by=2", "sleep=0"], tmp_path)
    assert result.returncode == 0, result.stderr
    reports = _reports(result.stderr)
    metrics = [
        (r["group"], r["steps_completed"], r["metrics"]) for k, r in reports if k == "metrics"
    ]
    assert metrics == [
        ("training", 10, {"x": 20.0}),
        ("validation", 10, {"x": 20.0}),
        ("training", 20, {"x": 40.0}),
        ("validation", 20, {"x": 40.0}),
    ]
    checkpoints = [r for k, r in reports if k == "checkpoint"]
    assert len(checkpoints) == 1 and checkpoints[0]["steps_completed"] == 20
    saved = tmp_path / "checkpoints" / checkpoints[0]["uuid"]
    assert json.loads((saved / "state.json").read_text())["x"] == 40
    pid = r"\d+"
    assert re.search(rf"^INFO: \[{pid}\] root: batch 20 x=40$", result.stderr, re.M), result.stderr


def test_determined_style_script_invalid_hp_exits_zero_with_early_exit(tmp_path: Path) -> None:
    """det.InvalidHP raised inside ``with det.core.init()`` reports an invalid_hp early exit and
    ends the process with status 0, as in Determined."""
    result = run([str(CORE_API), "increment_by=0"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert ("early_exit", {"reason": "invalid_hp"}) in _reports(result.stderr)
    assert not any(k == "metrics" for k, _ in _reports(result.stderr))


def test_agent_exports_the_owner_and_cluster_id_the_spec_names(tmp_path: Path) -> None:
    """The agent turns the spec's ``user`` and ``cluster_id`` into the trial environment, so
    ``get_cluster_info().user`` / ``.cluster_id`` are set on a cluster (they were empty)."""
    from services.agent.runtime import RunSpec, trial_environment

    spec = {
        "allocation_id": "72.3",
        "trial_id": 72,
        "experiment_id": 7,
        "entrypoint": "python3 train.py",
        "user": "alice",
        "cluster_id": "5f0c-lab",
    }
    run_spec = RunSpec.from_api(spec_answer(**spec), "gpu03", tmp_path)
    base = {"PATH": "/bin", "CAIRN_USER": "agent-operator", "CAIRN_CLUSTER_ID": "stale"}
    (env,) = trial_environment(
        run_spec, agent_id="gpu03", api_url="http://api:8080/", gpu_slots={}, base=base
    )
    info = cairn.get_cluster_info(env)
    assert info is not None
    assert (info.user, info.cluster_id) == ("alice", "5f0c-lab")
