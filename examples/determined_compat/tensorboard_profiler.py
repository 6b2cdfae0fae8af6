"""Profiles system metrics while it trains and writes its own file to the TensorBoard path, then
uploads it."""

import logging
import time

import determined as det


def main(core_context):
    core_context.profiler.on(sampling_interval=1, samples_per_report=1)
    x = 0.0
    for step in range(1, 5):
        x += 1.0
        core_context.train.report_training_metrics(steps_completed=step, metrics={"x": x})
        time.sleep(0.3)
    core_context.profiler.off()
    core_context.train.report_validation_metrics(steps_completed=4, metrics={"x": x})
    tb_dir = core_context.train.get_tensorboard_path()
    (tb_dir / "notes.txt").write_text(f"trained to x={x}")
    core_context.train.upload_tensorboard_files(selector=lambda path: path.name == "notes.txt")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    with det.core.init() as core_context:
        main(core_context)
