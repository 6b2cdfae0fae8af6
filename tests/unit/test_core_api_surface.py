"""The rest of Determined's Core API surface in ``cairn.core``, off-cluster: TensorBoard files,
selective and sharded checkpoints, status and alerts, the profiler, searcher operations and the
preemption modes (sharding and the chief's broadcast with real torch.distributed processes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import cairn as det
import cairn.core
from cairn.core._distributed import DistributedContext, DummyDistributedContext
from cairn.core._reporter import LocalReporter
from cairn.core._tensorboard import crc32c
from cairn.core._train import TrainContext
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def off_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ``CAIRN_*`` or rank variables, a scratch working and temp directory."""
    for name in list(os.environ):
        if name.startswith("CAIRN_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))


def items(ctx: cairn.core.Context, kind: str) -> list[dict[str, Any]]:
    """What the off-cluster context reported of one kind."""
    reporter = ctx._reporter
    assert isinstance(reporter, LocalReporter)
    return [i for i in reporter.items if i["kind"] == kind]


def scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of one scalar tag, as TensorBoard itself reads the event files."""
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)]


# --- TensorBoard --------------------------------------------------------------------------


def test_crc32c_matches_the_standard_check_value() -> None:
    """The record checksum is CRC-32C: its check value for b"123456789" is 0xE3069283."""
    assert crc32c(b"123456789") == 0xE3069283


def test_auto_mode_writes_metric_reports_as_tensorboard_scalars() -> None:
    """With TensorboardMode.AUTO, training and validation reports become event files under
    get_tensorboard_path() that TensorBoard's own reader decodes, tag <group>/<name>."""
    with det.core.init() as ctx:
        path = ctx.train.get_tensorboard_path()
        ctx.train.report_training_metrics(10, {"loss": 0.5})
        ctx.train.report_training_metrics(20, {"loss": 0.25})
        ctx.train.report_validation_metrics(20, {"accuracy": 0.75})
    assert list(path.glob("events.out.tfevents.*"))
    assert scalars(path, "training/loss") == [(10, 0.5), (20, 0.25)]
    assert scalars(path, "validation/accuracy") == [(20, 0.75)]


def test_manual_mode_writes_no_event_files() -> None:
    """With TensorboardMode.MANUAL metric reports write nothing to the TensorBoard directory."""
    with det.core.init(tensorboard_mode=det.core.TensorboardMode.MANUAL) as ctx:
        ctx.train.report_training_metrics(10, {"loss": 0.5})
        assert list(ctx.train.get_tensorboard_path().iterdir()) == []


def test_upload_tensorboard_files_copies_selected_new_files_mangled(tmp_path: Path) -> None:
    """upload_tensorboard_files copies what the selector keeps, under the mangler's name, and a
    second call copies only files changed since."""
    storage = tmp_path / "storage"
    train = TrainContext(
        LocalReporter(),
        DistributedContext(rank=1, size=2, local_rank=1),
        run_id=1,
        tensorboard_mode=det.core.TensorboardMode.MANUAL,
        tensorboard_path=tmp_path / "tb",
        tensorboard_storage=storage,
    )
    base = train.get_tensorboard_path()
    (base / "a.txt").write_text("a")
    (base / "sub").mkdir()
    (base / "sub" / "b.txt").write_text("b")
    (base / "skip.tmp").write_text("x")

    def keep(p: Path) -> bool:
        return p.suffix == ".txt"

    def mangle(p: Path, rank: int) -> Path:
        return p.with_name(f"rank{rank}-{p.name}")

    train.upload_tensorboard_files(keep, mangle)
    found = sorted(p.relative_to(storage).as_posix() for p in storage.rglob("*") if p.is_file())
    assert found == ["rank1-a.txt", "sub/rank1-b.txt"]
    (storage / "rank1-a.txt").unlink()
    (base / "sub" / "b.txt").write_text("bb")
    train.upload_tensorboard_files(keep, mangle)
    assert not (storage / "rank1-a.txt").exists(), "unchanged files are not copied again"
    assert (storage / "sub" / "rank1-b.txt").read_text() == "bb"


def test_tensorboard_upload_is_a_no_op_off_cluster() -> None:
    """Off-cluster there is no trial storage: upload_tensorboard_files copies nothing anywhere."""
    with det.core.init(checkpoint_storage="ckpt") as ctx:
        (ctx.train.get_tensorboard_path() / "x").write_text("x")
        ctx.train.upload_tensorboard_files()
    assert not Path("ckpt").exists() or not any(Path("ckpt").rglob("x"))


# --- checkpoints --------------------------------------------------------------------------


def make_dir(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_upload_download_and_restore_with_selectors(tmp_path: Path) -> None:
    """upload keeps only the selected files; download and restore_path hand out only the files
    their selector keeps (restore_path's copy is removed afterwards); metadata round-trips."""
    src = make_dir(
        tmp_path / "src", {"model.pt": "m", "optim.pt": "o", "log.txt": "l", "d/e.pt": "e"}
    )
    with det.core.init(checkpoint_storage=tmp_path / "ckpt") as ctx:
        uuid = ctx.checkpoint.upload(
            src, {"steps_completed": 5, "note": "x"}, selector=lambda p: p.endswith(".pt")
        )
        stored = {
            p.relative_to(ctx.checkpoint.root / uuid).as_posix()
            for p in (ctx.checkpoint.root / uuid).rglob("*")
            if p.is_file()
        }
        assert stored == {"model.pt", "optim.pt", "d/e.pt", "metadata.json", ".cairn-checkpoint"}
        assert ctx.checkpoint.get_metadata(uuid) == {"steps_completed": 5, "note": "x"}
        ctx.checkpoint.download(uuid, tmp_path / "out", selector=lambda p: p == "model.pt")
        assert [p.name for p in (tmp_path / "out").iterdir()] == ["model.pt"]
        with ctx.checkpoint.restore_path(uuid, selector=lambda p: p.startswith("d/")) as path:
            assert [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()] == [
                "d/e.pt"
            ]
        assert not path.exists()
        with ctx.checkpoint.restore_path(uuid) as path:
            assert path == ctx.checkpoint.root / uuid
    resources = items(ctx, "checkpoint")[0]["resources"]
    assert sorted(resources) == ["d/e.pt", "metadata.json", "model.pt", "optim.pt"]
    assert (
        resources["metadata.json"] == (ctx.checkpoint.root / uuid / "metadata.json").stat().st_size
    )


def test_delete_with_globs_removes_only_matching_files(tmp_path: Path) -> None:
    """delete(globs=[...]) removes the matching files and keeps metadata.json; delete() removes
    the whole checkpoint; a missing checkpoint is fine."""
    src = make_dir(tmp_path / "src", {"model.pt": "m", "optim/state.pt": "o", "keep.txt": "k"})
    with det.core.init(checkpoint_storage=tmp_path / "ckpt") as ctx:
        uuid = ctx.checkpoint.upload(src, {"steps_completed": 1})
        ctx.checkpoint.delete(uuid, globs=["optim/*", "*.txt"])
        left = sorted(p.name for p in (ctx.checkpoint.root / uuid).rglob("*") if p.is_file())
        assert left == [".cairn-checkpoint", "metadata.json", "model.pt"]
        ctx.checkpoint.delete(uuid)
        assert not (ctx.checkpoint.root / uuid).exists()
        ctx.checkpoint.delete(uuid)


def test_non_chief_upload_without_shard_is_refused(tmp_path: Path) -> None:
    """A worker calling upload(shard=False) gets a RuntimeError and stores nothing."""
    worker = DistributedContext(rank=1, size=2, local_rank=1)
    with (
        det.core.init(distributed=worker, checkpoint_storage=tmp_path / "ckpt") as ctx,
        pytest.raises(RuntimeError, match="chief"),
    ):
        ctx.checkpoint.upload(tmp_path, {"steps_completed": 1})
    assert not (tmp_path / "ckpt").exists()


SHARDED = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch.distributed as dist
    import cairn as det

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    case, root = sys.argv[1], Path(sys.argv[2])
    mine = root / f"src{rank}"
    mine.mkdir(parents=True)
    (mine / f"shard{rank}.pt").write_text(f"weights of {rank}")
    (mine / "common.json").write_text("same" if case == "merge" else f"differs {rank}")
    (mine / f"scratch{rank}.tmp").write_text("not wanted")
    with det.core.init(checkpoint_storage=root / "ckpt") as ctx:
        try:
            uuid = ctx.checkpoint.upload(
                mine,
                {"steps_completed": 7} if rank == 0 else {f"rank{rank}": True},
                shard=True,
                selector=lambda p: not p.endswith(".tmp"),
            )
            print("UUID", uuid, flush=True)
            with ctx.checkpoint.restore_path(uuid, selector=lambda p: p == f"shard{rank}.pt") as p:
                print("RESTORED", sorted(x.name for x in p.iterdir()), flush=True)
        except RuntimeError as exc:
            print("ERROR", exc, flush=True)
    dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    script: str, *args: str, size: int = 2, timeout: float = 120
) -> list[subprocess.CompletedProcess[str]]:
    """Runs ``script`` as ``size`` real processes of one torch.distributed (gloo) group."""
    port = str(free_port())
    procs = []
    for rank in range(size):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
        env.update(
            PYTHONPATH=str(ROOT),
            RANK=str(rank),
            WORLD_SIZE=str(size),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(size),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def lines(done: subprocess.CompletedProcess[str], prefix: str) -> list[str]:
    return [line[len(prefix) + 1 :] for line in done.stdout.splitlines() if line.startswith(prefix)]


@pytest.mark.timeout(240)
def test_sharded_upload_merges_every_ranks_files_and_metadata(tmp_path: Path) -> None:
    """Two real ranks upload(shard=True) with selectors: one checkpoint holds both ranks' selected
    files and their merged metadata, identical shared files are fine, only the chief reports it,
    and each rank restores just its own shard."""
    ranks = run_ranks(SHARDED, "merge", str(tmp_path))
    for done in ranks:
        assert done.returncode == 0, done.stderr
    uuids = {lines(done, "UUID")[0] for done in ranks}
    assert len(uuids) == 1
    uuid = uuids.pop()
    folder = tmp_path / "ckpt" / uuid
    assert sorted(p.name for p in folder.iterdir()) == [
        ".cairn-checkpoint",
        "common.json",
        "metadata.json",
        "shard0.pt",
        "shard1.pt",
    ]
    assert json.loads((folder / "metadata.json").read_text()) == {
        "rank1": True,
        "steps_completed": 7,
    }
    reported = [
        line for done in ranks for line in done.stderr.splitlines() if "] checkpoint:" in line
    ]
    assert len(reported) == 1 and reported[0] in ranks[0].stderr
    assert lines(ranks[0], "RESTORED") == ["['shard0.pt']"]
    assert lines(ranks[1], "RESTORED") == ["['shard1.pt']"]


@pytest.mark.timeout(240)
def test_sharded_upload_with_conflicting_files_fails_on_every_rank(tmp_path: Path) -> None:
    """A file two ranks give with different contents fails the sharded upload on both ranks
    (none hangs), naming the file; no checkpoint is reported."""
    ranks = run_ranks(SHARDED, "conflict", str(tmp_path))
    for done in ranks:
        assert done.returncode == 0, done.stderr
        errors = lines(done, "ERROR")
        assert len(errors) == 1 and "common.json given by ranks [0, 1]" in errors[0]
        assert "] checkpoint:" not in done.stderr
    assert not any((tmp_path / "ckpt").glob("*/metadata.json"))


# --- status, alerts, best validation --------------------------------------------------------


def test_status_alert_and_best_validation_off_cluster(caplog: pytest.LogCaptureFixture) -> None:
    """Off-cluster set_status and alert are logged and printed as reports, bad input is a
    ValueError, and get_experiment_best_validation() is None as Determined's stand-in."""
    with caplog.at_level("INFO", logger="cairn.core"), det.core.init() as ctx:
        ctx.train.set_status("evaluating")
        ctx.alert(title="diverged", description="loss is nan", level="error")
        ctx.alert()
        with pytest.raises(ValueError, match="level"):
            ctx.alert("x", "y", level="critical")
        with pytest.raises(ValueError, match="status"):
            ctx.train.set_status("s" * 5000)
        assert ctx.train.get_experiment_best_validation() is None
    assert [i["status"] for i in items(ctx, "status")] == ["evaluating"]
    assert [(i["title"], i["level"]) for i in items(ctx, "alert")] == [
        ("diverged", "error"),
        ("", "info"),
    ]
    assert "cairn alert [error] diverged: loss is nan" in caplog.text


# --- profiler ------------------------------------------------------------------------------


async def test_profiler_is_off_by_default_and_reports_system_metrics_while_on() -> None:
    """No system metrics without profiler.on(); while on, real samples of CPU and memory are
    reported as the "system" group, and off() stops the thread."""
    with det.core.init() as ctx:
        assert not ctx.profiler.enabled
        ctx.profiler.on(sampling_interval=0.05, samples_per_report=2)  # type: ignore[arg-type]
        await wait_until(lambda: len(items(ctx, "metrics")) >= 2, timeout=30)
        ctx.profiler.off()
        assert not ctx.profiler.enabled
        count = len(items(ctx, "metrics"))
    reports = items(ctx, "metrics")
    assert len(reports) == count, "nothing is reported after off()"
    assert {r["group"] for r in reports} == {"system"}
    assert [r["steps_completed"] for r in reports] == list(range(1, len(reports) + 1))
    first = reports[0]["metrics"]
    assert {"cpu_util_pct", "memory_used_gb", "memory_util_pct"} <= set(first)
    assert 0 <= first["memory_util_pct"] <= 100 and first["memory_used_gb"] > 0


async def test_profiler_averages_samples_per_report() -> None:
    """Each report is the mean of samples_per_report samples; a partial batch is reported on off()."""
    train = TrainContext(LocalReporter(), DummyDistributedContext(), run_id=1)
    values = iter(range(1000))
    lock = threading.Lock()

    def sampler() -> dict[str, float]:
        with lock:
            return {"x": float(next(values))}

    profiler = cairn.core.ProfilerContext(train, DummyDistributedContext(), samplers=[sampler])
    profiler.on(sampling_interval=0.01, samples_per_report=3)  # type: ignore[arg-type]
    reporter = train._reporter
    assert isinstance(reporter, LocalReporter)
    await wait_until(lambda: len(reporter.items) >= 2, timeout=30)
    profiler.off()
    xs = [i["metrics"]["x"] for i in reporter.items]
    assert xs[:2] == [2.0, 5.0]  # sample 0 primes the counters; then means of 1-3 and 4-6


# --- searcher operations ---------------------------------------------------------------------


def test_searcher_operations_off_cluster_give_one_op_of_length_one() -> None:
    """Off-cluster operations() yields a single op of length 1 (Determined's stand-in); progress
    is reported as a fraction, completing twice or not at all is an error."""
    with det.core.init() as ctx:
        ops = list_ops(ctx)
        assert [op.length for op in ops] == [1]
        with pytest.raises(RuntimeError, match="once"):
            ops[0].report_completed(0.1)
        with pytest.raises(RuntimeError, match="report_completed"):
            for _ in ctx.searcher.operations():
                pass
        assert ctx.searcher.get_configured_units() is None
    assert [i["progress"] for i in items(ctx, "progress")] == [1.0]


def list_ops(ctx: cairn.core.Context) -> list[cairn.core.SearcherOperation]:
    ops = []
    for op in ctx.searcher.operations():
        op.report_progress(op.length)
        op.report_completed(0.5)
        ops.append(op)
    return ops


def test_searcher_units_follow_the_config() -> None:
    """get_configured_units() reads max_length's unit (stored configs list the unused ones as null)."""
    from cairn.core._searcher import configured_units

    assert configured_units({"searcher": {"max_length": {"epochs": 3}}}) is det.core.Unit.EPOCHS
    stored = {"searcher": {"max_length": {"batches": None, "records": 640, "epochs": None}}}
    assert configured_units(stored) is det.core.Unit.RECORDS
    assert configured_units({"searcher": {"max_length": 100}}) is None


def test_searcher_chief_only_mode_refuses_workers() -> None:
    """A worker iterating operations() in ChiefOnly mode gets a RuntimeError."""
    worker = DistributedContext(rank=1, size=2, local_rank=1)
    with det.core.init(distributed=worker) as ctx, pytest.raises(RuntimeError, match="ChiefOnly"):
        next(iter(ctx.searcher.operations(det.core.SearcherMode.ChiefOnly)))


# --- preemption modes ------------------------------------------------------------------------


def test_preempt_modes_off_cluster() -> None:
    """Off-cluster should_preempt() is False in every mode; in ChiefOnly a worker calling it is
    a RuntimeError; an unknown mode is a ValueError."""
    for mode in det.core.PreemptMode:
        with det.core.init(preempt_mode=mode) as ctx:
            assert not ctx.preempt.should_preempt()
            ctx.preempt.acknowledge_preemption_signal()
            assert ctx.preempt.acknowledged
    worker = DistributedContext(rank=1, size=2, local_rank=1)
    chief_only = det.core.PreemptMode.ChiefOnly
    with (
        det.core.init(distributed=worker, preempt_mode=chief_only) as ctx,
        pytest.raises(RuntimeError, match="ChiefOnly"),
    ):
        ctx.preempt.should_preempt()
    with pytest.raises(ValueError):
        det.core.init(preempt_mode="NEVER")  # type: ignore[arg-type]


BROADCAST = textwrap.dedent(
    """
    import torch.distributed as dist
    import cairn as det

    dist.init_process_group("gloo")
    with det.core.init() as ctx:
        if ctx.distributed.rank == 0:
            ctx.preempt._flag.set()  # stands for the cluster's signal reaching the chief
        first = ctx.preempt.should_preempt(auto_ack=False)
        acked_after_first = ctx.preempt.acknowledged
        second = ctx.preempt.should_preempt()
        print("ANSWER", first, acked_after_first, second, ctx.preempt.acknowledged, flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.timeout(240)
def test_workers_ask_chief_broadcasts_the_chiefs_answer() -> None:
    """In WorkersAskChief mode a worker, which watches nothing itself, gets the chief's True
    through the broadcast; auto_ack=False leaves the signal unacknowledged until a later call."""
    ranks = run_ranks(BROADCAST)
    for done in ranks:
        assert done.returncode == 0, done.stderr
        assert lines(done, "ANSWER") == ["True False True True"]


def test_gpu_samples_parse_nvidia_smi_for_the_trials_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU samples come from nvidia-smi's CSV, limited to the trial's GPU UUIDs (this machine has
    no GPU: a script on PATH prints what nvidia-smi prints); a failing nvidia-smi gives none."""
    from cairn.core._profiler import sample_gpus

    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(
        "#!/bin/sh\n"
        'echo "GPU-aaa, 10, 1024, 81559"\n'
        'echo "GPU-bbb, 90, 3072, 81559"\n'
        'echo "GPU-ccc, [N/A], [N/A], 81559"\n'
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    assert sample_gpus(["GPU-bbb"]) == {
        "gpu0_util_pct": 90.0,
        "gpu0_memory_used_gb": 3.0,
        "gpu_util_pct": 90.0,
        "gpu_memory_used_gb": 3.0,
    }
    everything = sample_gpus()
    assert everything["gpu_util_pct"] == 50.0 and "gpu2_util_pct" not in everything
    tool.write_text("#!/bin/sh\nexit 9\n")
    assert sample_gpus() == {}
