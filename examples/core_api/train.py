"""A Core API training script written the way Determined's tutorials write one.

Only its import line says cairn: ``import cairn as det``. It "trains" a counter (``x`` grows by
``increment_by`` per batch), reports training and validation metrics, checkpoints, resumes from
the cluster's ``latest_checkpoint`` and stops cleanly when preempted.

Hyperparameters: ``increment_by`` (1; below 1 raises ``det.InvalidHP``), ``batches`` (100),
``sleep`` (seconds per batch, 0.01) and ``fail_after`` (0 = never: a run that did not resume
exits with code 3 after checkpointing that batch, so a restart resumes from it).

Each checkpoint's metadata records what ``det.get_cluster_info()`` said (trial and experiment
ids, run id, hyperparameters, the checkpoint this run resumed from).

Off-cluster: ``python train.py [key=value ...]``; ``det.get_cluster_info()`` is ``None`` there,
so the script uses its default hyperparameters updated by the arguments.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import cairn as det

DEFAULTS: dict[str, Any] = {"increment_by": 1, "batches": 100, "sleep": 0.01, "fail_after": 0}


def load_state(
    core_context: det.core.Context, latest_checkpoint: str, trial_id: int | None
) -> tuple[int, int]:
    """``(x, batches completed)`` from a checkpoint; a checkpoint of another trial (a warm
    start) keeps ``x`` but starts counting batches from zero."""
    with core_context.checkpoint.restore_path(latest_checkpoint) as path:
        state = json.loads((path / "state.json").read_text())
    if state["trial_id"] != trial_id:
        return int(state["x"]), 0
    return int(state["x"]), int(state["batches"])


def save_state(
    core_context: det.core.Context, x: int, batches: int, provenance: dict[str, Any]
) -> str:
    """Checkpoints ``x`` after ``batches`` batches; returns the checkpoint's uuid."""
    metadata = {"steps_completed": batches, **provenance}
    with core_context.checkpoint.store_path(metadata) as (path, uuid):
        (path / "state.json").write_text(
            json.dumps({"x": x, "batches": batches, "trial_id": provenance["trial_id"]})
        )
    logging.info("checkpoint %s at batch %d", uuid, batches)
    return uuid


def main(
    core_context: det.core.Context,
    hparams: dict[str, Any],
    latest_checkpoint: str | None,
    provenance: dict[str, Any],
) -> int:
    """Trains; returns the process exit code."""
    increment_by = int(hparams["increment_by"])
    if increment_by < 1:
        raise det.InvalidHP(f"increment_by must be at least 1, got {increment_by}")
    total = int(hparams["batches"])
    fail_after = int(hparams["fail_after"])
    x, start = 0, 0
    if latest_checkpoint is not None:
        x, start = load_state(core_context, latest_checkpoint, provenance["trial_id"])
        logging.info("resumed from %s at batch %d (x=%d)", latest_checkpoint, start, x)
    batch = start
    while batch < total:
        time.sleep(float(hparams["sleep"]))
        x += increment_by
        batch += 1
        if batch % 10 == 0 or batch == total:
            core_context.train.report_training_metrics(steps_completed=batch, metrics={"x": x})
            core_context.train.report_validation_metrics(steps_completed=batch, metrics={"x": x})
            logging.info("batch %d x=%d", batch, x)
        if fail_after and batch == fail_after and latest_checkpoint is None:
            save_state(core_context, x, batch, provenance)
            logging.error("failing after batch %d (fail_after)", batch)
            return 3
        if core_context.preempt.should_preempt():
            save_state(core_context, x, batch, provenance)
            logging.info("preempted at batch %d", batch)
            return 0
    save_state(core_context, x, batch, provenance)
    return 0


def off_cluster_hparams(args: list[str]) -> dict[str, Any]:
    """The defaults updated by ``key=value`` arguments (values parsed as JSON when possible)."""
    hparams = dict(DEFAULTS)
    for arg in args:
        key, sep, raw = arg.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {arg!r}")
        try:
            hparams[key] = json.loads(raw)
        except json.JSONDecodeError:
            hparams[key] = raw
    return hparams


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    if info is not None:
        hparams = {**DEFAULTS, **info.trial.hparams}
        latest_checkpoint = info.latest_checkpoint
        provenance = {
            "trial_id": int(info.trial.trial_id),
            "experiment_id": info.trial.experiment_id,
            "run_id": info.trial.trial_run_id,
            "hparams": info.trial.hparams,
            "user_data": info.user_data,
            "resumed_from": latest_checkpoint,
        }
    else:
        hparams, latest_checkpoint = off_cluster_hparams(sys.argv[1:]), None
        provenance = {"trial_id": None, "resumed_from": None}
    with det.core.init() as core_context:
        sys.exit(main(core_context, hparams, latest_checkpoint, provenance))
