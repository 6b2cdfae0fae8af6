"""Shows a status line, asks for the experiment's best validation so far and raises an alert
with it."""

import logging

import determined as det


def main(core_context, hparams):
    core_context.train.set_status("training")
    loss = 1.0 / float(hparams["quality"])
    core_context.train.report_training_metrics(steps_completed=2, metrics={"loss": loss})
    core_context.train.set_status("validating")
    core_context.train.report_validation_metrics(
        steps_completed=2, metrics={"validation_loss": loss}
    )
    best = core_context.train.get_experiment_best_validation()
    assert best is not None and best <= loss, (best, loss)
    core_context.alert(title="best so far", description=f"best={best} mine={loss}", level="info")
    core_context.train.set_status("done")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else {"quality": 1}
    with det.core.init() as core_context:
        main(core_context, hparams)
