"""``core_v2`` with no master configured runs a script locally, as Determined's does: a
Determined-style unmanaged script (``from determined.experimental import core_v2``) reports,
checkpoints to a local directory, resumes by its external ids, ends failed when it raises, and
is refused (for now) when a master is configured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from cairn.compat import install_path
from cairn.experimental import _unmanaged, core_v2

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
from determined.experimental import core_v2

core_v2.init(config=core_v2.Config(
    name="local-run", hparams={"lr": 0.5}, data={"dataset": "digits"},
    external_experiment_id="exp-1", external_trial_id=sys.argv[1],
    checkpoint_storage="file://" + sys.argv[2]))
start = 0
if core_v2.info.latest_checkpoint:
    with core_v2.checkpoint.restore_path(core_v2.info.latest_checkpoint) as path:
        start = int((path / "step").read_text())
for step in range(start, start + 3):
    core_v2.train.report_training_metrics(steps_completed=step + 1, metrics={"loss": 1 / (step + 1)})
with core_v2.checkpoint.store_path({"steps_completed": start + 3}) as (path, uuid):
    (path / "step").write_text(str(start + 3))
print(json.dumps({"start": start, "run": core_v2.info.trial.trial_run_id,
                  "hparams": core_v2.info.trial.hparams, "data": core_v2.info.user_data,
                  "url": core_v2.url_reverse_webui_exp_view(),
                  "preempt": core_v2.preempt.should_preempt()}))
if len(sys.argv) > 3:
    raise RuntimeError("the script fails")
"""


def run_script(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs SCRIPT as a plain program with the opt-in on its path and no master variable."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "DET_"))}
    environ.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(install_path())]), **env)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_local_run_resumes_by_external_ids_and_ends_failed_on_an_exception(
    tmp_path: Path,
) -> None:
    """Run 1 starts fresh; run 2 with the same ids resumes from run 1's checkpoint; another
    trial id starts fresh; a run that raises is recorded ERROR, a clean one COMPLETED."""
    storage = tmp_path / "storage"
    first = run_script(tmp_path, "trial-a", str(storage))
    assert first.returncode == 0, first.stderr
    seen = json.loads(first.stdout)
    assert (seen["start"], seen["run"], seen["preempt"]) == (0, 1, False)
    assert seen["hparams"] == {"lr": 0.5} and seen["data"] == {"dataset": "digits"}
    assert seen["url"] == storage.as_uri()
    assert '"loss": 1.0' in first.stderr  # reports are printed locally

    second = run_script(tmp_path, "trial-a", str(storage), "fail")
    assert second.returncode == 1 and "the script fails" in second.stderr
    resumed = json.loads(second.stdout)
    assert (resumed["start"], resumed["run"]) == (3, 2)
    ledger = json.loads((storage / ".unmanaged" / "exp-1" / "trial-a.json").read_text())
    assert (ledger["runs"], ledger["state"], ledger["steps_completed"]) == (2, "ERROR", 6)

    other = run_script(tmp_path, "trial-b", str(storage))
    assert json.loads(other.stdout)["start"] == 0
    ledger = json.loads((storage / ".unmanaged" / "exp-1" / "trial-b.json").read_text())
    assert ledger["state"] == "COMPLETED"
    assert len(list(storage.glob("*/step"))) == 3


def test_a_configured_master_is_reported_to_and_an_unreachable_one_fails_the_run(
    tmp_path: Path,
) -> None:
    """With DET_MASTER set, ``init()`` reports to that master (none there: it fails naming it)."""
    done = run_script(
        tmp_path,
        "t",
        str(tmp_path / "s"),
        DET_MASTER="http://127.0.0.1:9",
        CAIRN_HOME=str(tmp_path),
    )
    assert done.returncode == 1
    assert "127.0.0.1:9" in done.stderr and not (tmp_path / "s" / ".unmanaged").exists()


def test_init_needs_a_config_off_a_cluster_and_names_ids_in_pairs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No config off a cluster is a ValueError; a trial id without an experiment id too; the
    deprecated ``defaults=`` still works, with a FutureWarning; ``close()`` resets ``train``."""
    for name in _unmanaged.MASTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("CAIRN_TRIAL_ID", raising=False)
    with pytest.raises(ValueError, match="needs config"):
        core_v2.init()
    with pytest.raises(ValueError, match="external_experiment_id"):
        core_v2.init(config=core_v2.Config(external_trial_id="x"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        core_v2.init(
            defaults=core_v2.DefaultConfig(name="old-style"),
            checkpoint_storage=str(tmp_path / "ckpt"),
        )
    assert any(issubclass(w.category, FutureWarning) for w in caught)
    try:
        assert core_v2.train is not None and core_v2.info is not None
        assert core_v2.info.trial.config["name"] == "old-style"
        assert core_v2.info.trial.config["searcher"] == {"name": "single", "metric": "unmanaged"}
    finally:
        core_v2.close()
    assert core_v2.train is None


def test_storage_shortcuts_are_determineds() -> None:
    """A path or file:// URL is a directory, s3://bucket/prefix a bucket; others are refused."""
    assert _unmanaged.storage_config("file:///data/ckpt") == {
        "type": "directory",
        "container_path": "/data/ckpt",
    }
    assert _unmanaged.storage_config("s3://bucket/runs/a") == {
        "type": "s3",
        "bucket": "bucket",
        "prefix": "runs/a",
    }
    with pytest.raises(ValueError, match="gs://"):
        _unmanaged.storage_config("gs://bucket")
