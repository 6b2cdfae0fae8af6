"""Search efficiency on a real model: random, ASHA, TPE and PBT on the digits MLP.

Each method drives cairn's own search method (``events.domain.search``, the code the
searcher service runs) against an in-process trial runner that really trains
``examples/digits``' MLP on scikit-learn's bundled digits, one epoch per step, with the same
budget in epochs for every method. The cluster is left out on purpose, to stay cheap on two cores:
scheduling, processes and the log add time, not search decisions. Trials run in turns (the
least-trained live trial trains next), honour the method's concurrency, validate and checkpoint
after every epoch; a PBT clone starts from the checkpoint (weights and optimiser) it names.

For each seed, the target is the best validation accuracy random search reaches within the
budget; a method's figure is the epochs it spent until its best-so-far accuracy first reached
that target (``-``: not within the budget). ``speedup`` is random's epochs / the method's, the
median over seeds. Ray Tune's ASHA (``ASHAScheduler``, random sampling, the same space and
budget) runs beside it for wall time when ``ray[tune]`` is installed. A PNG plots best accuracy so
far against epochs spent, the median over seeds per method.

``python -m bench search`` (``CAIRN_BENCH_SEARCH_SEEDS=5``, ``CAIRN_BENCH_SEARCH_BUDGET=128``).
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Measure, Report, print_table, progress
from events.domain.config import parse_config
from events.domain.search import Create, Shutdown, Stop, make_method

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
SEEDS = int(os.environ.get("CAIRN_BENCH_SEARCH_SEEDS", "5"))
BUDGET = int(os.environ.get("CAIRN_BENCH_SEARCH_BUDGET", "128"))
EPOCHS_PER_TRIAL = 8

SPACE: dict[str, Any] = {
    "lr": {"type": "log", "base": 10, "minval": -4.5, "maxval": -0.5},
    "dropout": {"type": "double", "minval": 0.0, "maxval": 0.7},
    "weight_decay": {"type": "log", "base": 10, "minval": -6, "maxval": -1},
    "hidden": 64,
    "batch_size": 32,
}
"""Learning rate, dropout and weight decay matter (a bad learning rate does not learn, a big
weight decay underfits); the width is fixed so that a PBT clone can load its parent's weights."""


def searchers() -> dict[str, dict[str, Any]]:
    """Each method's searcher config for the same budget (``BUDGET`` epochs)."""
    trials = max(BUDGET // EPOCHS_PER_TRIAL, 2)
    return {
        "random": {"name": "random", "max_trials": trials, "max_concurrent_trials": 4},
        "asha": {
            "name": "async_halving",
            "num_rungs": 3,
            "divisor": 2,
            "time_metric": "epochs",
            "max_time": EPOCHS_PER_TRIAL,
            "max_trials": trials * 4,
            "max_concurrent_trials": 4,
        },
        "tpe": {
            "name": "tpe",
            "max_trials": trials,
            "max_concurrent_trials": 2,
            "n_startup_trials": max(trials // 3, 1),
        },
        "pbt": {
            "name": "pbt",
            "population_size": trials,
            "num_rounds": EPOCHS_PER_TRIAL,
            "length_per_round": {"epochs": 1},
            "replace_function": {"truncate_fraction": 0.25},
            "explore_function": {"resample_probability": 0.25, "perturb_factor": 0.2},
        },
    }


def _digits() -> Any:
    spec = importlib.util.spec_from_file_location("digits_train", ROOT / "examples/digits/train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class _Trial:
    model: Any
    optimizer: Any
    seed: int
    epochs: int = 0


@dataclass
class Curve:
    """Best validation accuracy so far after each epoch spent (index = epochs - 1)."""

    best: list[float] = field(default_factory=list)
    trials: int = 0
    seconds: float = 0.0

    def epochs_to(self, target: float) -> int | None:
        """Epochs spent until the best accuracy first reached ``target``."""
        for i, value in enumerate(self.best):
            if value >= target - 1e-12:
                return i + 1
        return None


class Runner:
    """Trains digits MLP trials for one search method, one epoch at a time."""

    def __init__(self, digits: Any, data: tuple[Any, ...]) -> None:
        self.digits = digits
        self.data = data

    def run(self, searcher: dict[str, Any], seed: int, budget: int) -> Curve:
        """Drives the method until it shuts down or ``budget`` epochs are spent."""
        import torch

        config = parse_config(
            {
                "searcher": {"metric": "validation_loss", **searcher},
                "hyperparameters": SPACE,
                "reproducibility": {"experiment_seed": seed},
            }
        )
        method = make_method(config)
        _, _, x_val, y_val = self.data
        trials: dict[str, _Trial] = {}
        saved: dict[str, tuple[dict[str, Any], dict[str, Any], int]] = {}
        curve = Curve()
        best = 0.0
        started = time.perf_counter()

        def start(op: Create) -> None:
            torch.manual_seed(op.trial_seed)
            hp = op.hparams
            model = self.digits.build_model(int(hp["hidden"]), float(hp["dropout"]))
            optimizer = torch.optim.Adam(
                model.parameters(), lr=float(hp["lr"]), weight_decay=float(hp["weight_decay"])
            )
            trial = _Trial(model, optimizer, op.trial_seed)
            if op.warm_start is not None:
                weights, opt_state, epochs = saved[op.warm_start]
                model.load_state_dict(weights)
                optimizer.load_state_dict(opt_state)
                for group in optimizer.param_groups:  # the explored values win
                    group["lr"] = float(hp["lr"])
                    group["weight_decay"] = float(hp["weight_decay"])
                trial.epochs = epochs
            trials[op.request_id] = trial
            curve.trials += 1
            apply(method.on_trial_created(op.request_id))

        def close(request_id: str) -> None:
            if trials.pop(request_id, None) is not None:
                apply(method.on_trial_closed(request_id))

        def apply(ops: list[Any]) -> None:
            for op in ops:
                if isinstance(op, Create):
                    start(op)
                elif isinstance(op, Stop):
                    close(op.request_id)
                elif isinstance(op, Shutdown):
                    return

        apply(method.initial_operations())
        while trials and len(curve.best) < budget and not method.is_shutdown:
            request_id = min(trials, key=lambda r: (trials[r].epochs, r))
            trial = trials[request_id]
            self._epoch(trial)
            loss, accuracy = self.digits.evaluate(trial.model, x_val, y_val)
            trial.epochs += 1
            best = max(best, accuracy)
            curve.best.append(best)
            metric = loss if math.isfinite(loss) else float("inf")
            apply(method.on_validation(request_id, metric, float(trial.epochs)))
            if request_id in trials:
                uuid = f"{request_id}@{trial.epochs}"
                saved[uuid] = (
                    copy.deepcopy(trial.model.state_dict()),
                    copy.deepcopy(trial.optimizer.state_dict()),
                    trial.epochs,
                )
                apply(method.on_checkpoint(request_id, uuid, trial.epochs))
            if request_id in trials and trial.epochs >= EPOCHS_PER_TRIAL:
                close(request_id)  # a trial's (or a PBT lineage's) full length
        curve.seconds = time.perf_counter() - started
        return curve

    def _epoch(self, trial: _Trial) -> None:
        import torch
        from torch import nn

        x_train, y_train, _, _ = self.data
        n = len(x_train)
        order = torch.randperm(
            n, generator=torch.Generator().manual_seed(trial.seed + trial.epochs)
        )
        trial.model.train()
        for start in range(0, n - 31, 32):
            idx = order[start : start + 32]
            loss = nn.functional.cross_entropy(trial.model(x_train[idx]), y_train[idx])
            trial.optimizer.zero_grad()
            loss.backward()
            trial.optimizer.step()


def ray_asha(
    digits: Any, data: tuple[Any, ...], seed: int, budget: int
) -> tuple[float, float, int]:
    """Ray Tune's ASHA on the same space and budget: (wall seconds, best accuracy, epochs
    trained). Its trials (twice random's count) stop at ASHA's rungs, as cairn's do.

    Raises:
        ImportError: ``ray[tune]`` is not installed.
    """
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    def trainable(config: dict[str, Any]) -> None:
        import torch
        from torch import nn

        torch.set_num_threads(1)
        x_train, y_train, x_val, y_val = data
        torch.manual_seed(seed)
        model = digits.build_model(64, config["dropout"])
        optimizer = torch.optim.Adam(
            model.parameters(), lr=config["lr"], weight_decay=config["weight_decay"]
        )
        n = len(x_train)
        for epoch in range(EPOCHS_PER_TRIAL):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
            model.train()
            for start in range(0, n - 31, 32):
                idx = order[start : start + 32]
                loss = nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            val_loss, accuracy = digits.evaluate(model, x_val, y_val)
            tune.report({"validation_loss": val_loss, "accuracy": accuracy, "epoch": epoch + 1})

    space = {
        "lr": tune.loguniform(10**-4.5, 10**-0.5),
        "dropout": tune.uniform(0.0, 0.7),
        "weight_decay": tune.loguniform(1e-6, 1e-1),
    }
    scheduler = ASHAScheduler(
        time_attr="epoch", max_t=EPOCHS_PER_TRIAL, grace_period=2, reduction_factor=2
    )
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        started = time.perf_counter()
        tuner = tune.Tuner(
            trainable,
            param_space=space,
            tune_config=tune.TuneConfig(
                metric="validation_loss",
                mode="min",
                scheduler=scheduler,
                num_samples=max(BUDGET // EPOCHS_PER_TRIAL, 2) * 2,
                max_concurrent_trials=2,
            ),
            run_config=tune.RunConfig(
                storage_path=tempfile.mkdtemp(prefix="cairn-bench-ray-"), verbose=0
            ),
        )
        results = tuner.fit()
        seconds = time.perf_counter() - started
        frames = [r.metrics_dataframe for r in results if r.metrics_dataframe is not None]
        epochs = sum(len(frame) for frame in frames)
        accuracy = max(
            (
                r.metrics_dataframe["accuracy"].max()
                for r in results
                if r.metrics_dataframe is not None
            ),
            default=0.0,
        )
        return seconds, float(accuracy), epochs
    finally:
        ray.shutdown()


def plot(curves: dict[str, list[Curve]], path: Path) -> str | None:
    """Median best-accuracy-so-far against epochs per method, as a PNG; ``None`` on success,
    else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (make bench installs requirements-bench.txt)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, runs in curves.items():
        length = max(len(c.best) for c in runs)
        median = []
        for i in range(length):
            values = [c.best[min(i, len(c.best) - 1)] for c in runs if c.best]
            median.append(statistics.median(values))
        ax.plot(range(1, length + 1), median, label=name)
    ax.set_xlabel("epochs spent")
    ax.set_ylabel("best validation accuracy so far (median over seeds)")
    ax.set_title("digits MLP: search efficiency at the same epoch budget")
    ax.set_ylim(0.8, 1.0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _fmt(value: float | None, pattern: str = "{:.0f}") -> str:
    return "-" if value is None else pattern.format(value)


async def run(ctx: BenchContext) -> Report:
    """The search-efficiency benchmark (no database needed)."""
    import torch

    torch.set_num_threads(1)
    digits = _digits()
    data = digits.load_data()
    runner = Runner(digits, data)
    methods = searchers()
    curves: dict[str, list[Curve]] = {name: [] for name in methods}
    progress(
        f"search: {len(methods)} methods x {SEEDS} seeds, {BUDGET} epochs each, digits MLP "
        "trained in-process (simulated trial runner, no cluster)"
    )
    for seed in range(1, SEEDS + 1):
        for name, searcher in methods.items():
            curve = runner.run(searcher, seed, BUDGET)
            curves[name].append(curve)
            progress(
                f"search: seed {seed} {name}: best {curve.best[-1]:.4f} after "
                f"{len(curve.best)} epochs, {curve.trials} trials, {curve.seconds:.1f}s"
            )
    rows = []
    measures = []
    reached: dict[str, list[int | None]] = {}
    for name, runs in curves.items():
        epochs = [c.epochs_to(r.best[-1]) for c, r in zip(runs, curves["random"], strict=True)]
        reached[name] = epochs
        got = [e for e in epochs if e is not None]
        random_epochs = [r.epochs_to(r.best[-1]) for r in curves["random"]]
        speedups = [re / e for e, re in zip(epochs, random_epochs, strict=True) if e and re]
        random_got = [e for e in random_epochs if e is not None]
        median_epochs = statistics.median(got) if got else None
        speedup = statistics.median(speedups) if speedups else None
        best = statistics.median(c.best[-1] for c in runs)
        seconds = statistics.median(c.seconds for c in runs)
        rows.append(
            [
                name,
                f"{len(got)}/{len(runs)}",
                _fmt(median_epochs),
                _fmt(speedup, "{:.2f}x"),
                f"{best:.4f}",
                f"{seconds:.1f}",
            ]
        )
        measures.append(
            Measure(
                name=f"search {name}: speedup vs random (random's epochs / its epochs, median)",
                cairn=speedup,
                baseline=1.0,
                baseline_label="random search",
                unit="x",
                count=len(runs),
                notes=f"reached random's best in {len(got)}/{len(runs)} seeds; median epochs "
                f"{_fmt(median_epochs)} vs random's {_fmt(statistics.median(random_got) if random_got else None)}",
            )
        )
    print()
    print(
        f"Search efficiency, digits MLP, {BUDGET} epochs per method, {SEEDS} seeds "
        "(in-process trial runner; target = random search's best validation accuracy per seed):"
    )
    print_table(
        ["method", "reached", "epochs (median)", "speedup vs random", "best acc", "wall s"],
        rows,
    )
    notes = []
    try:
        seconds, accuracy, ray_epochs = ray_asha(digits, data, 1, BUDGET)
        cairn_asha = statistics.median(c.seconds for c in curves["asha"])
        print(
            f"\nRay Tune ASHA (seed 1, same space and budget, 2 concurrent): {seconds:.1f}s wall, "
            f"{ray_epochs} epochs, best accuracy {accuracy:.4f}; cairn's ASHA method, "
            f"in-process: {cairn_asha:.1f}s, {BUDGET} epochs"
        )
        measures.append(
            Measure(
                name="search asha: epochs trained per second of wall time",
                cairn=BUDGET / cairn_asha if cairn_asha else None,
                baseline=ray_epochs / seconds if seconds else None,
                baseline_label="Ray Tune ASHAScheduler",
                unit="epochs/s",
                count=1,
                notes=f"cairn {cairn_asha:.1f}s in-process, Ray Tune {seconds:.1f}s",
            )
        )
    except ImportError as exc:
        reason = f"Ray Tune not run: ray[tune] is not installed ({exc})"
        print(f"\n{reason}")
        notes.append(reason)
    png = RESULTS / "search_efficiency.png"
    why = plot(curves, png)
    if why is None:
        print(f"plot: {png}")
    else:
        print(f"plot: not drawn, {why}")
        notes.append(f"plot not drawn: {why}")
    return Report(
        measures=measures,
        details={
            "budget_epochs": BUDGET,
            "seeds": SEEDS,
            "epochs_to_random_best": reached,
            "curves": {n: [c.best for c in runs] for n, runs in curves.items()},
        },
        notes=notes,
    )
