"""Stage 2: checkpoints, so the trial can stop (pause, preemption, a crash) and resume.

Every tenth batch the state is stored as a checkpoint; a run that starts with
``info.latest_checkpoint`` set loads it and carries on from its batch. When the cluster asks the
trial to stop (``should_preempt()``), it returns right after a checkpoint.
"""

import json
import logging
import pathlib
import time

import determined as det

BATCHES = 100


def save(path: pathlib.Path, x: int, batches: int, trial_id: int) -> None:
    (path / "state.json").write_text(json.dumps({"x": x, "batches": batches, "trial": trial_id}))


def load(path: pathlib.Path, trial_id: int) -> tuple[int, int]:
    state = json.loads((path / "state.json").read_text())
    # A checkpoint of another trial (a warm start) gives its x but not its progress.
    return state["x"], state["batches"] if state["trial"] == trial_id else 0


def train(core_context: det.core.Context, latest: str | None, trial_id: int) -> None:
    x, start = 0, 0
    if latest is not None:
        # NEW: resume from the checkpoint the cluster says is the latest.
        with core_context.checkpoint.restore_path(latest) as path:
            x, start = load(path, trial_id)
        logging.info("resumed at batch %d with x=%d", start, x)
    for batch in range(start, BATCHES):
        x += 1
        time.sleep(0.01)
        steps_completed = batch + 1
        if steps_completed % 10 == 0:
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
            # NEW: the metadata must say how far training got.
            with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (
                path,
                storage_id,
            ):
                save(path, x, steps_completed, trial_id)
            logging.info("checkpoint %s at batch %d", storage_id, steps_completed)
            # NEW: stop promptly when asked; the checkpoint just saved is where we resume.
            if core_context.preempt.should_preempt():
                logging.info("asked to stop at batch %d", steps_completed)
                return
    core_context.train.report_validation_metrics(steps_completed=BATCHES, metrics={"x": x})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this stage runs on a cluster"
    with det.core.init() as core_context:
        train(core_context, info.latest_checkpoint, info.trial.trial_id)
