"""Stage 1: the same loop, now reporting its metrics through the Core API.

``det.core.init()`` gives a context whose ``train`` reports metrics; every tenth batch the loop
reports ``x`` as a training metric, and at the end as a validation metric.
"""

import logging
import time

import determined as det

BATCHES = 100


def train(core_context: det.core.Context, increment_by: int) -> None:
    x = 0
    for batch in range(BATCHES):
        x += increment_by
        time.sleep(0.01)
        steps_completed = batch + 1
        if steps_completed % 10 == 0:
            # NEW: the cluster records the point; the web UI and the CLI show the curve.
            core_context.train.report_training_metrics(
                steps_completed=steps_completed, metrics={"x": x}
            )
            logging.info("reported x=%d at batch %d", x, steps_completed)
    core_context.train.report_validation_metrics(steps_completed=BATCHES, metrics={"x": x})


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    # NEW: one context for the whole run; leaving the block delivers what is queued.
    with det.core.init() as core_context:
        train(core_context, increment_by=1)
