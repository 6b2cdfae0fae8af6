"""A model whose loss depends on its hyperparameters, for hyperparameter searches: it reports a
validation loss every ``validate_every`` steps and stops when the searcher preempts it (adaptive
ASHA stops its weaker trials that way)."""

import logging

import determined as det


def loss_at(hparams, step):
    distance = (float(hparams["learning_rate"]) - 0.1) ** 2 + 0.01 * int(hparams["layers"])
    return distance + 1.0 / step


def main(core_context, hparams, max_steps, validate_every):
    for step in range(1, max_steps + 1):
        loss = loss_at(hparams, step)
        core_context.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
        if step % validate_every == 0 or step == max_steps:
            core_context.train.report_validation_metrics(
                steps_completed=step, metrics={"validation_loss": loss}
            )
            if core_context.preempt.should_preempt():
                logging.info("stopped by the searcher after step %d", step)
                return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this script runs on a cluster"
    searcher = info.trial.config["searcher"]
    max_steps = int(searcher["max_length"]["batches"])
    with det.core.init() as core_context:
        main(core_context, info.trial.hparams, max_steps, validate_every=2)
