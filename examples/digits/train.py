"""A small PyTorch MLP on scikit-learn's bundled 8x8 digits (no download), on the Core API.

Hyperparameters: ``lr``, ``hidden``, ``dropout``, ``batch_size``; optional ``max_batches``
(default: the searcher's ``max_time`` when ``time_metric`` is ``batches``, else 1000) and
``validate_every`` (batches, default 100). Validation reports ``validation_loss``,
``validation_accuracy`` and ``batches`` (the ASHA time metric). Checkpoints hold ``model.pt``
(model, optimiser, steps) and resume exactly: the data order of each epoch is a function of the
trial seed and the epoch. Preemption checkpoints and exits 0.

Off-cluster: ``python train.py lr=0.003 max_batches=300 --checkpoint-dir DIR``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import cairn.core

DEFAULTS: dict[str, Any] = {
    "lr": 0.003,
    "hidden": 128,
    "dropout": 0.1,
    "batch_size": 32,
    "validate_every": 100,
}
VALIDATION_SIZE = 297  # of 1797 images; the first 1500 of a fixed shuffle train


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 digits: pixels (0..16, 64 per image) and labels.

    Read from the CSV that scikit-learn bundles, as its ``load_digits`` does, without importing
    ``sklearn.datasets`` (SciPy and all), which costs a trial process more than its training.
    """
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec else []:
        csv = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            table = np.loadtxt(csv, delimiter=",")
            return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_digits  # another layout: its own loader

    data = load_digits()
    return data.data, data.target


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Train/validation tensors from the bundled dataset, pixels scaled to [0, 1]."""
    pixels, labels = digits()
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    cut = len(x) - VALIDATION_SIZE
    return x[:cut], y[:cut], x[cut:], y[cut:]


def build_model(hidden: int, dropout: float) -> nn.Module:
    """64 -> hidden -> hidden -> 10 with ReLU and dropout."""
    return nn.Sequential(
        nn.Linear(64, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(hidden, 10),
    )


def max_batches_of(hp: dict[str, Any], config: dict[str, Any]) -> int:
    """How many batches to train: ``max_batches``, else the searcher's ``max_time``, else (PBT)
    ``num_rounds`` rounds of ``length_per_round`` batches."""
    if hp.get("max_batches"):
        return int(hp["max_batches"])
    searcher = config.get("searcher") or {}
    if searcher.get("time_metric") == "batches" and searcher.get("max_time"):
        return int(searcher["max_time"])
    round_length = searcher.get("length_per_round")
    if isinstance(round_length, dict):
        round_length = round_length.get("batches")
    if searcher.get("name") == "pbt" and isinstance(round_length, int):
        return int(searcher.get("num_rounds", 1)) * round_length
    return 1000


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Validation loss and accuracy."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(dim=1) == y).float().mean().item()
    model.train()
    return loss, accuracy


def batch_at(step: int, n: int, batch_size: int, seed: int) -> torch.Tensor:
    """Indices of batch ``step`` (0-based): epochs of ``n // batch_size`` batches, each epoch a
    permutation seeded by (seed, epoch), so a resumed run sees the same data order."""
    per_epoch = n // batch_size
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return order[index * batch_size : (index + 1) * batch_size]


def restore(ctx: cairn.core.Context, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Loads the trial's latest checkpoint into ``model`` and ``optimizer``, if it has one;
    returns the batches already trained (0 when starting fresh)."""
    latest = ctx.info.latest_checkpoint
    if latest is None:
        return 0
    with ctx.checkpoint.restore_path(latest) as path:
        state = torch.load(path / "model.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    steps = int(state["steps"])
    print(f"resumed from {latest} at batch {steps}", flush=True)
    return steps


def train(ctx: cairn.core.Context) -> int:
    """Trains, validates, checkpoints and honours preemption; returns the exit code."""
    info = ctx.info
    hp = {**DEFAULTS, **info.trial.hparams}
    seed = int(info.trial.trial_seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    if not 0.0 <= float(hp["dropout"]) < 1.0:
        raise cairn.core.InvalidHP(f"dropout must be in [0, 1), got {hp['dropout']}")

    x_train, y_train, x_val, y_val = load_data()
    model = build_model(int(hp["hidden"]), float(hp["dropout"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(hp["lr"]))
    batch_size = int(hp["batch_size"])
    total = max_batches_of(hp, info.trial.config)
    validate_every = max(int(hp["validate_every"]), 1)

    steps = restore(ctx, model, optimizer)

    def checkpoint() -> None:
        metadata = {"steps_completed": steps, "trial_id": info.trial.trial_id, "hparams": hp}
        with ctx.checkpoint.store_path(metadata) as (path, _uuid):
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save({**state, "steps": steps}, path / "model.pt")

    started = time.monotonic()
    running_loss, running_n = 0.0, 0
    model.train()
    while steps < total:
        idx = batch_at(steps, len(x_train), batch_size, seed)
        loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        running_loss += loss.item()
        running_n += 1
        if steps % validate_every == 0 or steps == total:
            ctx.train.report_training_metrics(steps, {"loss": running_loss / running_n})
            running_loss, running_n = 0.0, 0
            val_loss, accuracy = evaluate(model, x_val, y_val)
            ctx.train.report_validation_metrics(
                steps,
                {"validation_loss": val_loss, "validation_accuracy": accuracy, "batches": steps},
            )
            ctx.train.report_progress(steps / total)
            print(
                f"batch {steps}: validation_loss {val_loss:.4f} "
                f"validation_accuracy {accuracy:.4f} ({time.monotonic() - started:.1f}s)",
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
    """Entry point: ``python train.py [key=value ...] [--checkpoint-dir DIR]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", help="off-cluster hyperparameters, key=value")
    parser.add_argument("--checkpoint-dir", type=Path, default=None, help="off-cluster storage")
    args = parser.parse_args()
    hparams: dict[str, Any] = {}
    for item in args.overrides:
        key, _, raw = item.partition("=")
        hparams[key] = json.loads(raw)
    with cairn.core.init(hparams=hparams, checkpoint_storage=args.checkpoint_dir) as ctx:
        return train(ctx)


if __name__ == "__main__":
    sys.exit(main())
