"""The fault-free run of ``examples/digits/distributed.py`` on 2 ranks, computed in one process.

DDP with 2 ranks averages the ranks' gradients of each global batch: ``(g0 + g1) / 2``, which
is exact in binary floating point whatever the order (one addition of two numbers, one halving),
so this loop reproduces the gang's weights bit for bit with the example's own data order, model
and evaluation. ``python -m tests.e2e.ddp_reference SEED HPARAMS_JSON`` prints one JSON object:
``{steps: [validation_loss, validation_accuracy]}`` at every validation.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"
RANKS = 2


def validations(seed: int, hparams: dict[str, Any]) -> dict[int, tuple[float, float]]:
    """``{steps: (validation_loss, validation_accuracy)}`` of the fault-free 2-rank run."""
    sys.path.insert(0, str(DIGITS))
    import torch
    from torch import nn
    from train import DEFAULTS, batch_at, build_model, evaluate, load_data

    hp = {**DEFAULTS, **hparams}
    torch.manual_seed(seed)
    torch.set_num_threads(1)  # as every rank does
    x_train, y_train, x_val, y_val = load_data()
    model = build_model(int(hp["hidden"]), float(hp["dropout"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(hp["lr"]))
    params = list(model.parameters())
    batch_size, total = int(hp["batch_size"]), int(hp["max_batches"])
    validate_every = max(int(hp["validate_every"]), 1)
    out: dict[int, tuple[float, float]] = {}
    for step in range(total):
        idx = batch_at(step, len(x_train), batch_size, seed)
        grads = []
        for rank in range(RANKS):
            part = idx[rank::RANKS]
            share = len(part) * RANKS / batch_size
            model.zero_grad()
            (nn.functional.cross_entropy(model(x_train[part]), y_train[part]) * share).backward()
            grads.append([p.grad.clone() for p in params])  # type: ignore[union-attr]
        for p, *per_rank in zip(params, *grads, strict=True):
            p.grad = sum(per_rank[1:], per_rank[0]) / RANKS
        optimizer.step()
        if (step + 1) % validate_every == 0 or step + 1 == total:
            out[step + 1] = evaluate(model, x_val, y_val)
    return out


if __name__ == "__main__":
    print(json.dumps(validations(int(sys.argv[1]), json.loads(sys.argv[2]))))
