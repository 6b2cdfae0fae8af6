"""Reads ``det.get_cluster_info()`` and keeps what it said in a checkpoint's metadata."""

import logging

import determined as det

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format=det.LOG_FORMAT)
    info = det.get_cluster_info()
    assert info is not None, "this script runs on a cluster"
    assert isinstance(info.trial.trial_id, int)
    seen = {
        "steps_completed": 1,
        "user": info.user,
        "cluster_id": info.cluster_id,
        "task_type": info.task_type,
        "task_id": info.task_id,
        "trial_id": info.trial.trial_id,
        "experiment_id": info.trial.experiment_id,
        "trial_run_id": info.trial.trial_run_id,
        "hparams": info.trial.hparams,
        "user_data": info.user_data,
        "container_rank": info.container_rank,
        "container_addrs": info.container_addrs,
        "slot_ids": info.slot_ids,
        "latest_checkpoint": info.latest_checkpoint,
        "master_url": info.master_url,
    }
    with det.core.init() as core_context:
        core_context.train.report_validation_metrics(steps_completed=1, metrics={"ok": 1.0})
        with core_context.checkpoint.store_path(seen) as (path, _):
            (path / "cluster_info.txt").write_text(repr(info))
