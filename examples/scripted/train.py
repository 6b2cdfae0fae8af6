"""A scripted trial with no ML: it behaves exactly as its hyperparameters say.

Used by tests and demos to exercise the platform (metrics, checkpoints, restarts, preemption,
failures) in a fraction of a second. Hyperparameters (all optional):

- ``steps`` (100): total steps to complete.
- ``report_every`` (10): report training metrics (and validation) every N steps.
- ``checkpoint_every`` (25): checkpoint every N steps (0: only at the end and on preemption).
- ``sleep`` (0.0): seconds per step.
- ``fail_at_step`` (0 = never): after completing that step, save a checkpoint there and exit
  with code 3 -- unless this run resumed at or past that step, so the restart proceeds.
- ``crash_after`` (0 = never): raise ``RuntimeError`` after completing that step (every run
  that reaches it; exit code 1).
- ``exit_code`` (0): exit with this code after the last step.
- ``invalid_hp`` (false): raise ``cairn.core.InvalidHP`` at once (early exit, exit code 0).
- ``validation_offset`` (0.0): added to every validation loss, so that a search over it has one
  best trial whatever the order its reports arrive in.
- ``ignore_preemption`` (false): never ask ``should_preempt()`` (training code that only stops
  when it is done, or when the platform ends its process).

Off-cluster: ``python train.py steps=20 sleep=0.01 --checkpoint-dir DIR``; a second run with the
same directory resumes from the latest checkpoint's ``steps_completed``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import cairn.core

DEFAULTS: dict[str, Any] = {
    "steps": 100,
    "report_every": 10,
    "checkpoint_every": 25,
    "sleep": 0.0,
    "fail_at_step": 0,
    "crash_after": 0,
    "exit_code": 0,
    "invalid_hp": False,
    "ignore_preemption": False,
    "validation_offset": 0.0,
}


def loss_at(steps: int) -> float:
    """The scripted training loss: decreasing in ``steps``."""
    return 1.0 / (1.0 + 0.1 * steps)


def validation_loss_at(steps: int, offset: float = 0.0) -> float:
    """The scripted validation loss: decreasing in ``steps``, raised by ``offset``."""
    return 1.2 / (1.0 + 0.1 * steps) + offset


def save(ctx: cairn.core.Context, steps: int, trial_id: str) -> str:
    """Checkpoints the (tiny) training state at ``steps``."""
    metadata = {"steps_completed": steps, "trial_id": trial_id}
    with ctx.checkpoint.store_path(metadata) as (path, uuid):
        (path / "state.json").write_text(json.dumps({"steps": steps}))
    print(f"checkpoint {uuid} at step {steps}", flush=True)
    return uuid


def restore(ctx: cairn.core.Context) -> int:
    """The step count of the latest checkpoint (0 for a fresh start)."""
    latest = ctx.info.latest_checkpoint
    if latest is None:
        return 0
    with ctx.checkpoint.restore_path(latest) as path:
        state = json.loads((path / "state.json").read_text())
    steps = int(state["steps"])
    print(f"resumed from checkpoint {latest} at step {steps}", flush=True)
    return steps


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``key=value`` arguments (values parsed as JSON when possible) as off-cluster hparams."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"expected key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def train(ctx: cairn.core.Context) -> int:
    """Runs the script; returns the process exit code."""
    hp = {**DEFAULTS, **ctx.info.trial.hparams}
    if hp["invalid_hp"]:
        raise cairn.core.InvalidHP("invalid_hp is set")
    total = int(hp["steps"])
    report_every = max(int(hp["report_every"]), 1)
    checkpoint_every = int(hp["checkpoint_every"])
    fail_at = int(hp["fail_at_step"])
    crash_after = int(hp["crash_after"])
    offset = float(hp["validation_offset"])
    trial_id = ctx.info.trial.trial_id

    start = restore(ctx)
    steps = start
    last_checkpoint = start if start else -1
    print(f"training from step {start} to {total}", flush=True)
    while steps < total:
        time.sleep(float(hp["sleep"]))
        steps += 1
        if steps % report_every == 0 or steps == total:
            ctx.train.report_training_metrics(steps, {"loss": loss_at(steps)})
            ctx.train.report_validation_metrics(
                steps, {"validation_loss": validation_loss_at(steps, offset)}
            )
            ctx.train.report_progress(steps / total)
            print(f"step {steps} loss {loss_at(steps):.4f}", flush=True)
        if checkpoint_every > 0 and steps % checkpoint_every == 0:
            save(ctx, steps, trial_id)
            last_checkpoint = steps
        if fail_at and steps == fail_at and start < fail_at:
            if last_checkpoint != steps:
                save(ctx, steps, trial_id)
            print(f"failing at step {steps} (fail_at_step)", flush=True)
            return 3
        if crash_after and steps == crash_after:
            raise RuntimeError(f"crash_after={crash_after} reached")
        if not hp["ignore_preemption"] and ctx.preempt.should_preempt():
            if last_checkpoint != steps:
                save(ctx, steps, trial_id)
            print(f"preempted at step {steps}; exiting", flush=True)
            return 0
    if last_checkpoint != steps:
        save(ctx, steps, trial_id)
    print(f"done at step {steps}", flush=True)
    return int(hp["exit_code"])


def main() -> int:
    """Entry point: ``python train.py [key=value ...] [--checkpoint-dir DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="off-cluster hyperparameters, key=value")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="off-cluster storage")
    args = parser.parse_args()
    with cairn.core.init(
        hparams=parse_overrides(args.overrides), checkpoint_storage=args.checkpoint_dir
    ) as ctx:
        return train(ctx)


if __name__ == "__main__":
    sys.exit(main())
