"""Stage 4: the same trial on several workers, one per slot, started by the launcher.

``python3 -m determined.launch.torch_distributed`` starts one worker per slot with ``RANK``,
``WORLD_SIZE``, ... set; each worker joins a gloo process group (CPU) and builds its
``DistributedContext`` from it. Every batch the workers add up their ``increment_by`` with
``allgather``; only the chief (rank 0) reports metrics and stores checkpoints, and every worker
checks ``should_preempt()`` (the chief's answer is shared).
"""

import json
import logging
import pathlib
import time

import determined as det
import torch.distributed as dist

BATCHES = 100


def save(path: pathlib.Path, x: int, batches: int, trial_id: int) -> None:
    (path / "state.json").write_text(json.dumps({"x": x, "batches": batches, "trial": trial_id}))


def load(path: pathlib.Path, trial_id: int) -> tuple[int, int]:
    state = json.loads((path / "state.json").read_text())
    return state["x"], state["batches"] if state["trial"] == trial_id else 0


def train(
    core_context: det.core.Context, latest: str | None, trial_id: int, increment_by: int
) -> None:
    rank = core_context.distributed.rank
    x, start = 0, 0
    if latest is not None:
        with core_context.checkpoint.restore_path(latest) as path:
            x, start = load(path, trial_id)
    for batch in range(start, BATCHES):
        # NEW: every worker contributes its increment to every step.
        x += sum(core_context.distributed.allgather(increment_by))
        time.sleep(0.01)
        steps_completed = batch + 1
        if steps_completed % 10 == 0:
            # NEW: only the chief reports and checkpoints.
            if rank == 0:
                logging.info("x is now %d", x)
                core_context.train.report_training_metrics(
                    steps_completed=steps_completed, metrics={"x": x}
                )
                core_context.train.report_progress(steps_completed / BATCHES)
                core_context.train.report_validation_metrics(
                    steps_completed=steps_completed, metrics={"x": x}
                )
                with core_context.checkpoint.store_path({"steps_completed": steps_completed}) as (
                    path,
                    storage_id,
                ):
                    save(path, x, steps_completed, trial_id)
                logging.info("checkpoint %s at batch %d", storage_id, steps_completed)
            if core_context.preempt.should_preempt():
                return


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this stage runs on a cluster"
    # NEW: the launcher set the rendezvous; gloo needs no GPU.
    dist.init_process_group(backend="gloo")
    distributed = det.core.DistributedContext.from_torch_distributed()
    logging.info("worker %d of %d starting", distributed.rank, distributed.size)
    with det.core.init(distributed=distributed) as core_context:
        train(
            core_context,
            info.latest_checkpoint,
            info.trial.trial_id,
            info.trial.hparams["increment_by"],
        )
    dist.destroy_process_group()
