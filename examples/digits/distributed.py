"""The digits MLP trained data-parallel (DDP, gloo on CPU) across the ranks of a trial's gang.

Run through the launcher (``python3 -m cairn.launch.torch_distributed python3 distributed.py``):
``torchrun`` sets the ranks, this script joins the process group, every rank trains on its share
of each global batch of ``batch_size`` images and DDP averages the gradients, so the run follows
the single-process run with the same global batch. Only the chief reports and checkpoints; every
rank restores from the latest checkpoint, and ``should_preempt()`` answers the same on all ranks.
Hyperparameters as in ``train.py`` (``batch_size`` is the global batch).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from train import DEFAULTS, batch_at, build_model, evaluate, load_data, max_batches_of, restore

import cairn as det  # a Determined script: `import determined as det` is the only change


def train(ctx: det.core.Context) -> int:
    """Trains, validates, checkpoints (chief) and honours preemption; returns the exit code."""
    info, gang = ctx.info, ctx.distributed
    hp: dict[str, Any] = {**DEFAULTS, **info.trial.hparams}
    seed = int(info.trial.trial_seed)
    torch.manual_seed(seed)  # the same initial weights on every rank
    torch.set_num_threads(1)
    x_train, y_train, x_val, y_val = load_data()
    model = build_model(int(hp["hidden"]), float(hp["dropout"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(hp["lr"]))
    batch_size = int(hp["batch_size"])
    total = max_batches_of(hp, info.trial.config)
    validate_every = max(int(hp["validate_every"]), 1)

    steps = restore(ctx, model, optimizer)
    ddp = DistributedDataParallel(model)
    start = steps

    def checkpoint() -> None:
        if not gang.is_chief:
            return
        metadata = {"steps_completed": steps, "trial_id": info.trial.trial_id, "hparams": hp}
        with ctx.checkpoint.store_path(metadata) as (path, _uuid):
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "steps": steps}, path / "model.pt")

    started = time.monotonic()
    running_loss, running_n = 0.0, 0
    ddp.train()
    while steps < total:
        idx = batch_at(steps, len(x_train), batch_size, seed)[gang.rank :: gang.size]
        # Each rank's mean loss weighted by its share: DDP averages gradients over ranks, so the
        # step equals one step on the whole global batch (shares differ by at most one image).
        share = len(idx) * gang.size / batch_size
        loss = nn.functional.cross_entropy(ddp(x_train[idx]), y_train[idx]) * share
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        if running_n == 0 and steps == start + 1:
            print(f"training: first batch {steps} done", flush=True)  # on every rank
        running_loss += loss.item()
        running_n += 1
        if steps % validate_every == 0 or steps == total:
            mean = sum(gang.allgather(running_loss / running_n)) / gang.size
            running_loss, running_n = 0.0, 0
            val_loss, accuracy = evaluate(model, x_val, y_val)
            ctx.train.report_training_metrics(steps, {"loss": mean})
            ctx.train.report_validation_metrics(
                steps,
                {"validation_loss": val_loss, "validation_accuracy": accuracy, "batches": steps},
            )
            ctx.train.report_progress(steps / total)
            if gang.is_chief:
                print(
                    f"batch {steps}: loss {mean:.4f} validation_accuracy {accuracy:.4f} "
                    f"({gang.size} ranks, {time.monotonic() - started:.1f}s)",
                    flush=True,
                )
            checkpoint()
        if ctx.preempt.should_preempt():
            if steps % validate_every != 0:
                checkpoint()
            print(f"preempted at batch {steps}", flush=True)
            return 0
    return 0


def main() -> int:
    """Joins the process group ``torchrun`` describes, trains, leaves."""
    dist.init_process_group("gloo")
    try:
        gang = det.core.DistributedContext.from_torch_distributed()
        with det.core.init(distributed=gang) as ctx:
            return train(ctx)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
