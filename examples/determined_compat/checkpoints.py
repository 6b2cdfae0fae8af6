"""Checkpoints with ``store_path`` and resumes with ``restore_path``, as in Determined's
checkpointing tutorial; stops when preempted (a pause) and can crash once on purpose.

Hyperparameters: ``steps`` to train; ``crash_at`` (0 = never): a run that did not resume exits
with code 1 right after checkpointing that step; ``hold_at`` (0 = never): a run that did not
resume waits for preemption after checkpointing that step (so a pause is sure to find it
running). Every checkpoint's metadata says which checkpoint its run resumed from.
"""

import json
import logging
import sys
import time

import determined as det


def save(core_context, step, x, resumed_from):
    metadata = {"steps_completed": step, "resumed_from": resumed_from}
    with core_context.checkpoint.store_path(metadata) as (path, storage_id):
        (path / "state.json").write_text(json.dumps({"step": step, "x": x}))
    logging.info("saved checkpoint %s at step %d", storage_id, step)


def main(core_context, hparams, latest_checkpoint):
    step, x = 0, 0
    if latest_checkpoint is not None:
        with core_context.checkpoint.restore_path(latest_checkpoint) as path:
            state = json.loads((path / "state.json").read_text())
        step, x = state["step"], state["x"]
        logging.info("resumed from %s at step %d", latest_checkpoint, step)
    fresh = latest_checkpoint is None
    while step < hparams["steps"]:
        step += 1
        x += step
        core_context.train.report_training_metrics(steps_completed=step, metrics={"x": x})
        if step % 2 == 0 or step == hparams["steps"]:
            core_context.train.report_validation_metrics(steps_completed=step, metrics={"x": x})
            save(core_context, step, x, latest_checkpoint)
            if fresh and step == hparams["crash_at"]:
                logging.error("crashing on purpose after step %d", step)
                return 1
            if fresh and step == hparams["hold_at"]:
                deadline = time.monotonic() + 120
                while not core_context.preempt.should_preempt() and time.monotonic() < deadline:
                    time.sleep(0.05)
        if core_context.preempt.should_preempt():
            logging.info("preempted after step %d", step)
            return 0
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this script runs on a cluster"
    hparams = {"crash_at": 0, "hold_at": 0, **info.trial.hparams}
    with det.core.init() as core_context:
        code = main(core_context, hparams, info.latest_checkpoint)
    sys.exit(code)
