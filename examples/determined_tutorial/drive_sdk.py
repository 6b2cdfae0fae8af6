"""Drives an experiment through Determined's Python SDK: create it, wait for it, take its best
checkpoint, download it, read its metrics.

It is a Determined program, unchanged: the master and the login come from ``DET_MASTER``,
``DET_USER`` and ``DET_PASS``. Outside a cluster, ``import determined`` needs the opt-in::

    export PYTHONPATH="$(python -m cairn.compat.determined --install-path)"
    DET_MASTER=http://127.0.0.1:8080 DET_USER=admin DET_PASS=admin python3 drive_sdk.py ./out

It prints one JSON summary line and exits 0 when the experiment completed.
"""

import json
import pathlib
import sys

from determined.experimental import client


def main(out_dir: pathlib.Path) -> int:
    here = pathlib.Path(__file__).resolve().parent
    exp = client.create_experiment(config=str(here / "2_checkpoints.yaml"), model_dir=str(here))
    print(f"created experiment {exp.id}", file=sys.stderr)
    state = exp.wait(interval=0.5)
    if state != client.ExperimentState.COMPLETED:
        print(f"experiment {exp.id} ended {state.value}", file=sys.stderr)
        return 1
    best = exp.top_checkpoint()
    path = pathlib.Path(best.download(str(out_dir / best.uuid)))
    (trial,) = exp.list_trials()
    training = [(m.steps_completed, m.metrics["x"]) for m in trial.iter_metrics("training")]
    validation = [(m.steps_completed, m.metrics["x"]) for m in trial.iter_metrics("validation")]
    summary = {
        "experiment_id": exp.id,
        "state": state.value,
        "trial_id": trial.id,
        "checkpoint": best.uuid,
        "checkpoint_steps": best.metadata["steps_completed"],
        "checkpoint_trial": best.training.trial_id,
        "files": sorted(p.name for p in path.iterdir()),
        "state_json": json.loads((path / "state.json").read_text()),
        "training": training,
        "validation": validation,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "checkpoints")))
