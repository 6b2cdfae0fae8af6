"""Refuses hyperparameters it cannot train with by raising ``det.InvalidHP``; the searcher
counts the trial as invalid and the experiment goes on."""

import logging

import determined as det


def main(core_context, hparams):
    if int(hparams["width"]) % 2:
        raise det.InvalidHP(f"width must be even, got {hparams['width']}")
    core_context.train.report_validation_metrics(
        steps_completed=2, metrics={"validation_loss": 1.0 / int(hparams["width"])}
    )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else {"width": 2}
    with det.core.init() as core_context:
        main(core_context, hparams)
