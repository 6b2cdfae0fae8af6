"""The lab suite's trial: a tiny torch regression trained with the Core API in a container.

Fits ``y = 3x + 1`` with SGD at ``learning_rate``; reports a validation loss every 10 batches,
checkpoints every ``checkpoint_every`` batches (the model's state dict and the batch), resumes
from the latest checkpoint and stops cleanly when preempted. ``sleep`` seconds per batch keep a
trial alive long enough for the suite to kill its agent mid-trial.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import torch

import cairn as det


def main(core: det.core.Context, hparams: dict, latest: str | None, trial_id: int) -> int:
    """Trains; returns the exit code."""
    torch.manual_seed(trial_id)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=float(hparams["learning_rate"]))
    batch = 0
    agent = os.environ["CAIRN_AGENT_ID"]
    if latest is not None:
        with core.checkpoint.restore_path(latest) as path:
            state = torch.load(path / "model.pt")
        model.load_state_dict(state["model"])
        batch = int(state["batch"])
        logging.info("resumed from checkpoint %s at batch %d on %s", latest, batch, agent)
    else:
        logging.info("started from scratch on %s (torch %s)", agent, torch.__version__)
    every = int(hparams["checkpoint_every"])
    for op in core.searcher.operations():
        while batch < op.length:
            x = torch.rand(64, 1)
            loss = torch.nn.functional.mse_loss(model(x), 3 * x + 1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            batch += 1
            time.sleep(float(hparams["sleep"]))
            if batch % 10 == 0:
                core.train.report_training_metrics(batch, {"loss": loss.item()})
            if batch % 50 == 0:
                core.train.report_validation_metrics(batch, {"validation_loss": validate(model)})
            if batch % every == 0:
                save(core, model, batch)
            if core.preempt.should_preempt():
                save(core, model, batch)
                return 0
        val = validate(model)
        core.train.report_validation_metrics(batch, {"validation_loss": val})
        op.report_completed(val)
    save(core, model, batch)
    return 0


def validate(model: torch.nn.Module) -> float:
    """The model's loss on fresh samples."""
    with torch.no_grad():
        x = torch.rand(256, 1)
        return float(torch.nn.functional.mse_loss(model(x), 3 * x + 1))


def save(core: det.core.Context, model: torch.nn.Module, batch: int) -> None:
    """Checkpoints the model after ``batch`` batches."""
    with core.checkpoint.store_path({"steps_completed": batch}) as (path, uuid):
        torch.save({"model": model.state_dict(), "batch": batch}, path / "model.pt")
    logging.info("checkpoint %s at batch %d", uuid, batch)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "runs on a cluster only"
    with det.core.init() as core_context:
        sys.exit(
            main(
                core_context,
                info.trial.hparams,
                info.latest_checkpoint,
                int(info.trial.trial_id),
            )
        )
