"""The singleton-style Core API (``core_v2``) in a managed trial: the config passed to ``init``
is ignored there, and ``core_v2.train``/``checkpoint``/``info`` are the trial's."""

import logging

import determined as det
from determined.experimental import core_v2


def main() -> None:
    core_v2.init(config=core_v2.Config(name="ignored-inside-a-trial", hparams={"steps": 99}))
    info = core_v2.info
    assert info is not None and core_v2.train is not None and core_v2.checkpoint is not None
    steps = int(info.trial.hparams["steps"])
    for step in range(1, steps + 1):
        core_v2.train.report_training_metrics(steps_completed=step, metrics={"x": float(step)})
    core_v2.train.report_validation_metrics(steps_completed=steps, metrics={"x": float(steps)})
    metadata = {"steps_completed": steps, "trial_id": info.trial.trial_id}
    with core_v2.checkpoint.store_path(metadata) as (path, storage_id):
        (path / "steps").write_text(str(steps))
    logging.info("checkpoint %s", storage_id)
    core_v2.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    main()
