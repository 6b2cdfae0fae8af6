"""A tiny regression trained with DeepSpeed, one worker per slot, written as a Determined user
writes it: ``python3 -m determined.launch.deepspeed`` starts the workers, each builds its
``DistributedContext`` with ``from_deepspeed()``, and only the chief reports and checkpoints.

CPU workers talk over gloo; on GPUs the same script runs with DeepSpeed's default backend.
"""

import logging

import deepspeed
import determined as det
import torch

STEPS = 8
CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
}


def train(core_context: det.core.Context, engine: deepspeed.DeepSpeedEngine) -> None:
    rank = core_context.distributed.rank
    torch.manual_seed(rank)
    loss = torch.tensor(0.0)
    for step in range(1, STEPS + 1):
        x = torch.randn(8, 4)
        loss = (engine(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses = core_context.distributed.allgather(loss.item())
        if rank == 0 and step % 4 == 0:
            core_context.train.report_training_metrics(
                steps_completed=step, metrics={"loss": sum(losses) / len(losses)}
            )
    if rank == 0:
        core_context.train.report_validation_metrics(
            steps_completed=STEPS, metrics={"loss": loss.item()}
        )
        with core_context.checkpoint.store_path({"steps_completed": STEPS}) as (path, uuid):
            torch.save(engine.module.state_dict(), path / "model.pt")
        logging.info("checkpoint %s", uuid)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else None)
    distributed = det.core.DistributedContext.from_deepspeed()
    logging.info("worker %d of %d starting", distributed.rank, distributed.size)
    model = torch.nn.Linear(4, 1)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=CONFIG
    )
    with det.core.init(distributed=distributed) as core_context:
        train(core_context, engine)
