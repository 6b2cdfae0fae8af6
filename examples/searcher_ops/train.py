"""A Core API script written against Determined <= 0.37, data-parallel over torch.distributed.

Only its import line says cairn: ``import cairn as det``. Every rank "trains" a counter op by op
(``for op in core_context.searcher.operations()``), the chief reports training and validation
metrics (which land in TensorBoard files too), asks how the whole experiment is doing
(``get_experiment_best_validation``) and raises an alert about it. Each rank then gives its own
shard to one sharded checkpoint (``upload(shard=True)``, scratch files left out by a selector) and
downloads only its shard back; every rank also uploads a note of its own as a TensorBoard file.

Hyperparameters: ``increment`` (how much the counter grows per batch). The loss is
``1 / (1 + counter)``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import cairn as det


def train(core_context: det.core.Context, increment: int) -> None:
    rank = core_context.distributed.rank
    chief = rank == 0
    counter, steps = 0, 0
    core_context.train.set_status("training")
    for op in core_context.searcher.operations():
        while steps < op.length:
            steps += 1
            counter += increment
            if steps % 5 == 0:
                core_context.train.report_training_metrics(steps, {"loss": 1 / (1 + counter)})
                if chief:
                    op.report_progress(steps)
                if core_context.preempt.should_preempt():  # every rank, in step
                    return
        core_context.train.set_status("validating")
        loss = 1 / (1 + counter)
        core_context.train.report_validation_metrics(steps, {"loss": loss})
        if chief:
            best = core_context.train.get_experiment_best_validation()
            if core_context.on_cluster:  # off-cluster there is no experiment to ask
                assert best is not None and best <= loss, (best, loss)
            core_context.alert(
                title="validated", description=f"loss={loss} best={best}", level="info"
            )
            op.report_completed(loss)
        save_shards(core_context, rank, steps, counter)
    core_context.train.set_status("done")


def save_shards(core_context: det.core.Context, rank: int, steps: int, counter: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        mine = Path(scratch, "ckpt")
        mine.mkdir()
        (mine / f"shard{rank}.txt").write_text(f"rank {rank} counter {counter}")
        (mine / f"scratch{rank}.log").write_text("not part of the checkpoint")
        metadata = {"steps_completed": steps} if rank == 0 else {f"shard{rank}": "present"}
        storage_id = core_context.checkpoint.upload(
            mine, metadata, shard=True, selector=lambda path: path.endswith(".txt")
        )
        back = Path(scratch, "back")
        core_context.checkpoint.download(
            storage_id, back, selector=lambda path: path == f"shard{rank}.txt"
        )
        assert [p.name for p in back.iterdir()] == [f"shard{rank}.txt"]
        assert (back / f"shard{rank}.txt").read_text() == f"rank {rank} counter {counter}"
    tensorboard = core_context.train.get_tensorboard_path()
    (tensorboard / "note.txt").write_text(f"rank {rank} saved {storage_id}")
    core_context.train.upload_tensorboard_files(
        selector=lambda path: path.name == "note.txt",
        mangler=lambda path, r: path.with_name(f"rank{r}-{path.name}"),
    )


def main() -> None:
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    distributed = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        distributed = det.core.DistributedContext.from_torch_distributed()
    info = det.get_cluster_info()
    increment = int(info.trial.hparams["increment"]) if info else 1
    with det.core.init(distributed=distributed) as core_context:
        train(core_context, increment)


if __name__ == "__main__":
    main()
