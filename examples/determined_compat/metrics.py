"""Reports training and validation metrics, as in Determined's first Core API tutorial."""

import logging
import time

import determined as det


def main(core_context: det.core.Context, steps: int, pause: float) -> None:
    x = 0.0
    for step in range(1, steps + 1):
        time.sleep(pause)
        x += 1.0
        core_context.train.report_training_metrics(steps_completed=step, metrics={"x": x})
        if step % 2 == 0:
            core_context.train.report_validation_metrics(
                steps_completed=step, metrics={"validation_x": x}
            )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else {"steps": 4, "pause": 0.0}
    with det.core.init() as core_context:
        main(core_context, steps=int(hparams["steps"]), pause=float(hparams["pause"]))
