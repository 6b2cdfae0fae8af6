"""A script written against Determined <= 0.37: it trains op by op from
``core_context.searcher.operations()`` and reports each op's searcher metric."""

import logging

import determined as det


def main(core_context, hparams):
    step, loss = 0, 1.0
    for op in core_context.searcher.operations():
        while step < op.length:
            step += 1
            loss = 1.0 / (step * float(hparams["speed"]))
            core_context.train.report_training_metrics(steps_completed=step, metrics={"loss": loss})
            if step % 2 == 0:
                op.report_progress(step)
        core_context.train.report_validation_metrics(
            steps_completed=step, metrics={"validation_loss": loss}
        )
        op.report_completed(loss)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    hparams = info.trial.hparams if info is not None else {"speed": 1.0}
    with det.core.init() as core_context:
        main(core_context, hparams)
