"""Stage 3: a hyperparameter search over ``increment_by``.

The trial reads its hyperparameters from the cluster info, and reports ``batches`` with each
validation so that the adaptive search can compare trials at the same amount of training and stop
the weak ones early (they are preempted, and return after their checkpoint).
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
    return state["x"], state["batches"] if state["trial"] == trial_id else 0


def train(
    core_context: det.core.Context, latest: str | None, trial_id: int, increment_by: int
) -> None:
    x, start = 0, 0
    if latest is not None:
        with core_context.checkpoint.restore_path(latest) as path:
            x, start = load(path, trial_id)
    for batch in range(start, BATCHES):
        x += increment_by
        time.sleep(0.01)
        steps_completed = batch + 1
        if steps_completed % 10 == 0:
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
            core_context.train.report_progress(steps_completed / BATCHES)
            # NEW: the searcher reads "x" (its metric) and "batches" (its time_metric).
            core_context.train.report_validation_metrics(
                steps_completed=steps_completed, metrics={"x": x, "batches": steps_completed}
            )
            with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (
                path,
                storage_id,
            ):
                save(path, x, steps_completed, trial_id)
            logging.info("checkpoint %s at batch %d", storage_id, steps_completed)
            if core_context.preempt.should_preempt():
                return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this stage runs on a cluster"
    # NEW: each trial of the search gets its own hyperparameters.
    hparams = info.trial.hparams
    with det.core.init() as core_context:
        train(core_context, info.latest_checkpoint, info.trial.trial_id, hparams["increment_by"])
