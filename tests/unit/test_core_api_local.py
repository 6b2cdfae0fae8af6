"""The Core API (``cairn.core``) off-cluster, its asynchronous reporter, and the examples run as
plain ``python train.py`` subprocesses."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import cairn.core
from cairn.core._http import Session
from cairn.core._reporter import HTTPReporter
from tests.helpers import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ROOT / "examples" / "scripted" / "train.py"
DIGITS = ROOT / "examples" / "digits" / "train.py"


@pytest.fixture(autouse=True)
def off_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ``CAIRN_*`` variables, no rank variables, and a scratch working directory."""
    for name in list(os.environ):
        if name.startswith("CAIRN_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def local_env() -> dict[str, str]:
    """The environment of an off-cluster subprocess (the repo importable, nothing of cairn's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def run(args: list[str], cwd: Path, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Runs a Python subprocess off-cluster and returns its result."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=local_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class FakeMaster:
    """A minimal stand-in for the HTTP peer (the API gateway) of a trial: it accepts report
    batches (optionally held until released, or failing first), issues checkpoint uuids and
    answers the preemption long poll."""

    def __init__(self, fail_first: int = 0) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.preempt = False
        self.fail_first = fail_first
        self.held = 0
        self.lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        master = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/checkpoint-ids"):
                    self._answer(200, {"uuid": str(uuid.uuid4())})
                    return
                with master.lock:
                    master.held += 1
                master._open.wait(timeout=60)
                with master.lock:
                    master.held -= 1
                    if master.fail_first > 0:
                        master.fail_first -= 1
                        self._answer(503, {"error": "try again"})
                        return
                    master.batches.append(body["items"])
                self._answer(200, {"accepted": len(body["items"])})

            def do_GET(self) -> None:
                self._answer(200, {"preempt": master.preempt})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hold(self) -> None:
        """Makes every POST wait, unanswered, until :meth:`release`."""
        self._open.clear()

    def release(self) -> None:
        """Answers the held POSTs and every later one at once."""
        self._open.set()

    def items(self) -> list[dict[str, Any]]:
        """Every item received, in order."""
        with self.lock:
            return [item for batch in self.batches for item in batch]

    def close(self) -> None:
        """Answers any held POST, then stops the server."""
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def master() -> Iterator[FakeMaster]:
    """A fake master that answers every report."""
    m = FakeMaster()
    yield m
    m.close()


def test_checkpoint_store_restore_round_trip_with_metadata(tmp_path: Path) -> None:
    """store_path writes files plus metadata.json under <root>/<uuid>; restore/download/get_metadata
    read them back, and a new off-cluster init finds it as the latest checkpoint."""
    root = tmp_path / "ckpts"
    with cairn.core.init(checkpoint_storage=root, hparams={"lr": 0.1}) as ctx:
        assert ctx.info.trial.hparams == {"lr": 0.1}
        assert ctx.info.latest_checkpoint is None
        assert cairn.core.get_cluster_info() is None
        assert not ctx.preempt.should_preempt()
        with ctx.checkpoint.store_path({"steps_completed": 7, "note": "x"}) as (path, uuid):
            (path / "weights.bin").write_bytes(b"\0" * 10)
            (path / "sub").mkdir()
            (path / "sub" / "a.txt").write_text("hi")
        assert path == root / uuid
        assert json.loads((path / "metadata.json").read_text()) == {
            "steps_completed": 7,
            "note": "x",
        }
        with ctx.checkpoint.restore_path(uuid) as restored:
            assert (restored / "weights.bin").read_bytes() == b"\0" * 10
        ctx.checkpoint.download(uuid, tmp_path / "copy")
        assert (tmp_path / "copy" / "sub" / "a.txt").read_text() == "hi"
        assert ctx.checkpoint.get_metadata(uuid)["steps_completed"] == 7
        reported = ctx._reporter.items[-1]  # type: ignore[attr-defined]
        assert reported["kind"] == "checkpoint" and reported["uuid"] == uuid
        assert reported["resources"] == {
            "metadata.json": len((path / "metadata.json").read_bytes()),
            "sub/a.txt": 2,
            "weights.bin": 10,
        }
        other = ctx.checkpoint.upload(tmp_path / "copy", {"steps_completed": 3})
    with cairn.core.init(checkpoint_storage=root) as ctx:
        assert ctx.info.latest_checkpoint == uuid  # most steps wins
        ctx.checkpoint.delete(other)
        assert not (root / other).exists()


def test_checkpoint_metadata_without_steps_completed_is_rejected(tmp_path: Path) -> None:
    """store_path and upload need metadata with steps_completed (ValueError otherwise)."""
    with cairn.core.init(checkpoint_storage=tmp_path) as ctx:
        for bad in (None, {}, {"steps": 3}, {"steps_completed": -1}):
            with pytest.raises(ValueError), ctx.checkpoint.store_path(bad):
                pass
        with pytest.raises(ValueError):
            ctx.checkpoint.upload(tmp_path, {"epoch": 1})
    assert list(tmp_path.iterdir()) == []


def test_failed_store_path_leaves_no_checkpoint(tmp_path: Path) -> None:
    """An exception inside store_path removes the partial directory and reports nothing."""
    with cairn.core.init(checkpoint_storage=tmp_path) as ctx:
        with (
            pytest.raises(RuntimeError),
            ctx.checkpoint.store_path({"steps_completed": 1}) as (
                path,
                _,
            ),
        ):
            (path / "half").write_text("x")
            raise RuntimeError("disk full")
        assert list(tmp_path.iterdir()) == []
        assert ctx._reporter.items == []  # type: ignore[attr-defined]


def test_reports_are_batched_in_the_background_and_flushed_on_close(master: FakeMaster) -> None:
    """Reporting never waits on the API: 1200 reports return while a POST hangs unanswered;
    close() then delivers every item with keys <alloc>:<seq>."""
    reporter = HTTPReporter(Session(master.url, "tok"), 11, "11.1")
    train = cairn.core.TrainContext(
        reporter, cairn.core.DistributedContext(rank=0, size=1, local_rank=0), run_id=1
    )
    master.hold()
    train.report_training_metrics(1, {"loss": 1.0})
    wait_until_sync(lambda: master.held > 0)

    def report_the_rest() -> None:
        for step in range(2, 1201):
            train.report_training_metrics(step, {"loss": 1.0 / step})

    reporting = threading.Thread(target=report_the_rest, daemon=True)
    reporting.start()
    reporting.join(timeout=30)
    assert not reporting.is_alive(), "a report waited on the API"
    assert master.held > 0 and master.items() == [], "every report returned before any delivery"
    master.release()
    assert reporter.close(timeout=20)
    items = master.items()
    assert [i["idempotency_key"] for i in items] == [f"11.1:{n}" for n in range(1, 1201)]
    assert [i["steps_completed"] for i in items] == list(range(1, 1201))
    assert all(i["group"] == "training" and i["run_id"] == 1 for i in items)
    assert max(len(b) for b in master.batches) <= 500


def test_failed_posts_are_retried_with_the_same_keys() -> None:
    """A 503 is retried with backoff; the items arrive once, keys unchanged."""
    master = FakeMaster(fail_first=2)
    try:
        reporter = HTTPReporter(Session(master.url, ""), 21, "21.3", flush_every=0.05)
        reporter.submit({"kind": "progress", "progress": 0.5})
        assert reporter.flush(timeout=10)
        assert master.items() == [
            {"kind": "progress", "progress": 0.5, "idempotency_key": "21.3:1"}
        ]
        reporter.close()
    finally:
        master.close()


def test_on_cluster_context_reports_chief_only_and_sees_preemption(
    master: FakeMaster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With CAIRN_* set, init() reads the cluster info, the chief's reports reach the API, a
    non-chief rank's are no-ops, and should_preempt() follows the long poll."""
    env = {
        "CAIRN_MASTER": master.url,
        "CAIRN_TOKEN": "t",
        "CAIRN_TRIAL_ID": "42",
        "CAIRN_EXPERIMENT_ID": "4",
        "CAIRN_RUN_ID": "3",
        "CAIRN_ALLOCATION_ID": "42.3",
        "CAIRN_HPARAMS": json.dumps({"lr": 0.5}),
        "CAIRN_TRIAL_SEED": "11",
        "CAIRN_STEPS_COMPLETED": "40",
        "CAIRN_LATEST_CHECKPOINT": "abc",
        "CAIRN_CHECKPOINT_DIR": str(tmp_path / "shared"),
        "CAIRN_SLOT_IDS": json.dumps(["s0"]),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    worker = cairn.core.DistributedContext(rank=1, size=2, local_rank=1)
    with cairn.core.init(distributed=worker) as ctx:
        ctx.train.report_validation_metrics(50, {"validation_loss": 0.1})
    assert master.items() == []
    with cairn.core.init() as ctx:
        info = ctx.info
        assert (info.trial.trial_id, info.trial.run_id, info.trial.trial_seed) == (42, 3, 11)
        assert info.trial.hparams == {"lr": 0.5} and info.latest_checkpoint == "abc"
        assert info.trial.steps_completed == 40
        ctx.train.report_validation_metrics(50, {"validation_loss": 0.1, "nan": float("nan")})
        with ctx.checkpoint.store_path({"steps_completed": 50}) as (path, uuid):
            (path / "w").write_text("w")
        assert path.parent == tmp_path / "shared"
        assert not ctx.preempt.should_preempt()
        master.preempt = True
        wait_until_sync(ctx.preempt.should_preempt, timeout=10)
    kinds = [(i["kind"], i.get("group")) for i in master.items()]
    assert kinds == [("metrics", "validation"), ("checkpoint", None)]
    assert master.items()[0]["metrics"] == {"validation_loss": 0.1}  # NaN left out
    assert master.items()[1]["uuid"] == uuid and master.items()[1]["run_id"] == 3


def test_invalid_hp_reports_early_exit_and_exits_zero(tmp_path: Path) -> None:
    """Raising InvalidHP inside ``with init()`` reports early exit invalid_hp and exits 0."""
    code = (
        "import cairn.core\n"
        "with cairn.core.init():\n"
        "    raise cairn.core.InvalidHP('lr too large')\n"
        "print('unreachable')\n"
    )
    result = run(["-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    assert '[cairn.core] early_exit: {"reason": "invalid_hp"}' in result.stderr
    assert "unreachable" not in result.stdout


def test_core_api_imports_fast_without_torch() -> None:
    """``import cairn.core`` pulls in neither torch nor numpy."""
    code = (
        "import sys, cairn.core; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    result = run(["-c", code], ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def test_core_api_imports_without_the_config_models() -> None:
    """``import cairn.core`` loads neither pydantic nor the config models (each trial's start)."""
    code = (
        "import sys, cairn.core; print(sorted(m for m in ('pydantic', 'events.domain.config',"
        " 'events.domain.checkpoint_storage.policy') if m in sys.modules))"
    )
    result = run(["-c", code], ROOT)
    assert result.stdout.strip() == "[]", result.stderr


def _reported_steps(stderr: str, group: str) -> list[int]:
    pattern = re.compile(r"^\[cairn\.core\] metrics: (\{.*\})$", re.M)
    return [
        json.loads(m)["steps_completed"]
        for m in pattern.findall(stderr)
        if json.loads(m)["group"] == group
    ]


def test_scripted_example_runs_off_cluster_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """The scripted example completes off-cluster; run again on its checkpoint dir it resumes
    from steps_completed, not from zero."""
    ckpt = tmp_path / "ck"
    first = run([str(SCRIPTED), "steps=10", "report_every=2", "checkpoint_every=5",
                 "--checkpoint-dir", str(ckpt)], tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "done at step 10" in first.stdout
    assert _reported_steps(first.stderr, "validation") == [2, 4, 6, 8, 10]
    assert sorted(json.loads((d / "metadata.json").read_text())["steps_completed"]
                  for d in ckpt.iterdir()) == [5, 10]  # fmt: skip

    second = run([str(SCRIPTED), "steps=14", "report_every=2", "checkpoint_every=5",
                  "--checkpoint-dir", str(ckpt)], tmp_path)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "training from step 10 to 14" in second.stdout
    assert _reported_steps(second.stderr, "validation") == [12, 14]


def test_scripted_example_fails_once_at_fail_at_step_then_proceeds(tmp_path: Path) -> None:
    """fail_at_step exits 3 after checkpointing there; the rerun resumes past it and completes."""
    args = [str(SCRIPTED), "steps=8", "report_every=1", "checkpoint_every=0", "fail_at_step=3",
            "exit_code=0"]  # fmt: skip
    first = run(args, tmp_path)
    assert first.returncode == 3, first.stderr
    second = run(args, tmp_path)
    assert second.returncode == 0, second.stderr
    assert "resumed from checkpoint" in second.stdout and "at step 3" in second.stdout
    assert _reported_steps(second.stderr, "training")[0] == 4


@pytest.mark.timeout(30)
def test_digits_example_learns_off_cluster(tmp_path: Path) -> None:
    """The PyTorch digits MLP trains 300 batches off-cluster to validation accuracy > 0.85."""
    result = run(
        [str(DIGITS), "max_batches=300", "validate_every=100", "--checkpoint-dir", str(tmp_path)],
        tmp_path,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    accuracies = re.findall(r"validation_accuracy ([0-9.]+)", result.stdout)
    assert len(accuracies) == 3 and float(accuracies[-1]) > 0.85, result.stdout
    assert any((d / "model.pt").exists() for d in tmp_path.iterdir())


def test_digits_example_reads_the_same_images_as_scikit_learn() -> None:
    """The digits example's own reader of scikit-learn's bundled CSV (no ``sklearn.datasets``
    import in a trial) gives exactly ``load_digits()``'s pixels and labels."""
    from sklearn.datasets import load_digits

    spec = importlib.util.spec_from_file_location("digits_example_train", DIGITS)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    pixels, labels = example.digits()
    expected = load_digits()
    assert pixels.shape == (1797, 64) and pixels.dtype == expected.data.dtype
    assert (pixels == expected.data).all() and (labels == expected.target).all()
