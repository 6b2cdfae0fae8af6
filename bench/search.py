"""Search against peers on one objective: the digits MLP in a wide space, a budget in epochs.

The objective: ``examples/digits``' MLP on scikit-learn's bundled digits, trained with Adam, in a
space where the method matters: a learning rate over five decades (most diverge or crawl), weight
decay over six (a big one underfits), dropout, the width and the batch size. A trial trains at
most ``MAX_EPOCHS`` epochs; every method gets the same budget of ``BUDGET`` epochs in all, so
random search can run only ``BUDGET / MAX_EPOCHS`` full trials. Every epoch trained, by any
method, costs one epoch of the budget (whatever its width or batch size), validates, and
updates the method's best validation accuracy so far.

The methods:

* cairn's random, ASHA, TPE and PBT (``events.domain.search``, the code the searcher service
  runs), driven in-process by a trial runner that trains one epoch at a time in turns (the
  least-trained live trial next), so the methods' concurrency behaves like that many workers;
* Optuna's ``TPESampler`` with its ``SuccessiveHalvingPruner`` (report each epoch, prune), by
  ask-and-tell in the same runner, with TPE's concurrency and the same startup trials;
* Ray Tune's ``ASHAScheduler`` and ``PopulationBasedTraining`` (random sampling, the same space,
  rungs, population and rounds as cairn's), on a local Ray with 2 CPUs, stopped once the budget
  is spent. Its curve is its reports in the order they were made.

Figures, the median over seeds: each method's best accuracy at the budget; the epochs each
method took to reach each other method's best (``-``: not within the budget); random-to-ASHA
speedup (random's epochs to its best / ASHA's epochs to random's best, a seed where ASHA never
got there counting as 0x). Goals: random-to-ASHA ``>= 3x``; cairn's ASHA vs Ray Tune's and
cairn's TPE vs Optuna's best accuracy ``>= 1.0x``. A PNG plots the median best accuracy so far
against epochs spent per method, beside the JSON results.

``python -m bench search`` (``CAIRN_BENCH_SEARCH_SEEDS=10``, ``CAIRN_BENCH_SEARCH_BUDGET=192``;
``CAIRN_BENCH_SEARCH_PEERS=0`` leaves Ray Tune out; Ray Tune's PBT runs only the first
``CAIRN_BENCH_SEARCH_RAY_PBT_SEEDS=1`` seeds: on two cores one run of it takes many minutes, its
members checkpointing every epoch and restarting as new actors when cloned; a Ray Tune run stops
after ``CAIRN_BENCH_SEARCH_RAY_SECONDS=600``, then having spent fewer epochs than the budget,
which the table shows). Comparisons with a peer use the seeds both ran.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import BenchContext, Measure, Report, load_average, print_table, progress
from events.domain.config import parse_config
from events.domain.search import Create, Shutdown, Stop, make_method

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
SEEDS = int(os.environ.get("CAIRN_BENCH_SEARCH_SEEDS", "10"))
BUDGET = int(os.environ.get("CAIRN_BENCH_SEARCH_BUDGET", "192"))
RAY = os.environ.get("CAIRN_BENCH_SEARCH_PEERS", "1") != "0"
RAY_PBT_SEEDS = int(os.environ.get("CAIRN_BENCH_SEARCH_RAY_PBT_SEEDS", "1"))
"""Seeds Ray Tune's PBT runs (the first ones): on two cores one run of it takes many minutes."""
RAY_SECONDS = float(os.environ.get("CAIRN_BENCH_SEARCH_RAY_SECONDS", "600"))
"""Wall-time limit of one Ray Tune run; one cut short has spent fewer epochs than the budget."""
MAX_EPOCHS = 16
"""A trial's full length (ASHA's top rung, PBT's rounds times their length)."""
LOSS_CAP = 1e6
"""The loss every method is told for a diverged trial (NaN or infinite), and the most it is told."""

LR = (-5.0, 0.0)
WEIGHT_DECAY = (-7.0, -0.5)
DROPOUT = (0.0, 0.8)
HIDDEN = [16, 32, 64, 128]
BATCH_SIZE = [32, 64, 128, 256]
SPACE: dict[str, Any] = {
    "lr": {"type": "log", "base": 10, "minval": LR[0], "maxval": LR[1]},
    "weight_decay": {
        "type": "log",
        "base": 10,
        "minval": WEIGHT_DECAY[0],
        "maxval": WEIGHT_DECAY[1],
    },
    "dropout": {"type": "double", "minval": DROPOUT[0], "maxval": DROPOUT[1]},
    "hidden": {"type": "categorical", "vals": HIDDEN},
    "batch_size": {"type": "categorical", "vals": BATCH_SIZE},
}
"""The space, as cairn's config writes it. Ray Tune's PBT mutates only the numeric three; cairn's
PBT may redraw a categorical one, and the runner then keeps the parent's width (so the clone can
load its weights) but takes the new batch size."""

CONCURRENCY = {"random": 4, "asha": 4, "tpe": 2, "pbt": 4}
RUNGS = 3
DIVISOR = 4
"""ASHA's rungs at 1, 4 and 16 epochs for both cairn and Ray Tune (Ray Tune's default reduction
factor and grace period); Optuna's pruner uses the same minimum resource and factor."""
PBT_ROUND = 2
PBT_FRACTION = 0.25
PBT_RESAMPLE = 0.25
PBT_PERTURB = 0.2


def full_trials() -> int:
    """How many full-length trials the budget pays for (random's and TPE's trial count)."""
    return max(BUDGET // MAX_EPOCHS, 2)


def startup_trials() -> int:
    """TPE's random startup trials, cairn's and Optuna's alike."""
    return max(full_trials() // 3, 1)


def searchers() -> dict[str, dict[str, Any]]:
    """cairn's methods' searcher configs for the same budget (``BUDGET`` epochs)."""
    trials = full_trials()
    return {
        "random": {
            "name": "random",
            "max_trials": trials,
            "max_concurrent_trials": CONCURRENCY["random"],
        },
        "asha": {
            "name": "async_halving",
            "num_rungs": RUNGS,
            "divisor": DIVISOR,
            "time_metric": "epochs",
            "max_time": MAX_EPOCHS,
            "max_trials": BUDGET,  # never the limit: the budget ends the search first
            "max_concurrent_trials": CONCURRENCY["asha"],
        },
        "tpe": {
            "name": "tpe",
            "max_trials": trials,
            "max_concurrent_trials": CONCURRENCY["tpe"],
            "n_startup_trials": startup_trials(),
        },
        "pbt": {
            "name": "pbt",
            "population_size": trials,
            "num_rounds": MAX_EPOCHS // PBT_ROUND,
            "length_per_round": {"epochs": PBT_ROUND},
            "replace_function": {"truncate_fraction": PBT_FRACTION},
            "explore_function": {
                "resample_probability": PBT_RESAMPLE,
                "perturb_factor": PBT_PERTURB,
            },
        },
    }


# -- the objective ---------------------------------------------------------------------------


def load_digits_module() -> Any:
    """``examples/digits/train.py`` as a module (its model, data and evaluation)."""
    spec = importlib.util.spec_from_file_location("digits_train", ROOT / "examples/digits/train.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def capped(loss: float) -> float:
    """The loss a method is told: ``LOSS_CAP`` for a diverged trial."""
    return min(loss, LOSS_CAP) if math.isfinite(loss) else LOSS_CAP


@dataclass
class Model:
    """One trial's network and optimiser, and the epochs it has trained."""

    net: Any
    optimizer: Any
    seed: int
    batch_size: int
    epochs: int = 0


def build(digits: Any, hp: dict[str, Any], seed: int) -> Model:
    """A fresh model for hyperparameters ``hp`` (initialised from ``seed``)."""
    import torch

    torch.manual_seed(seed)
    net = digits.build_model(int(hp["hidden"]), float(hp["dropout"]))
    optimizer = torch.optim.Adam(
        net.parameters(), lr=float(hp["lr"]), weight_decay=float(hp["weight_decay"])
    )
    return Model(net, optimizer, seed, int(hp["batch_size"]))


def load_state(model: Model, state: tuple[Any, Any, int], hp: dict[str, Any]) -> None:
    """Loads a parent's weights, optimiser and epochs; the (explored) ``hp`` win."""
    from torch import nn

    weights, opt_state, epochs = state
    model.net.load_state_dict(weights)
    model.optimizer.load_state_dict(opt_state)
    for group in model.optimizer.param_groups:
        group["lr"] = float(hp["lr"])
        group["weight_decay"] = float(hp["weight_decay"])
    for module in model.net.modules():
        if isinstance(module, nn.Dropout):
            module.p = float(hp["dropout"])
    model.epochs = epochs


def save_state(model: Model) -> tuple[Any, Any, int]:
    """A copy of the model's weights, optimiser state and epochs."""
    return (
        copy.deepcopy(model.net.state_dict()),
        copy.deepcopy(model.optimizer.state_dict()),
        model.epochs,
    )


def width(state: tuple[Any, Any, int]) -> int:
    """The hidden width of the network a saved state belongs to."""
    return int(state[0]["0.weight"].shape[0])


def train_epoch(digits: Any, data: tuple[Any, ...], model: Model) -> tuple[float, float]:
    """Trains one epoch (a permutation seeded by the trial and epoch), then validates:
    (validation loss, validation accuracy)."""
    import torch
    from torch import nn

    x_train, y_train, x_val, y_val = data
    n = len(x_train)
    size = model.batch_size
    order = torch.randperm(n, generator=torch.Generator().manual_seed(model.seed + model.epochs))
    model.net.train()
    for start in range(0, n - size + 1, size):
        idx = order[start : start + size]
        loss = nn.functional.cross_entropy(model.net(x_train[idx]), y_train[idx])
        model.optimizer.zero_grad()
        loss.backward()
        model.optimizer.step()
    model.epochs += 1
    val_loss, accuracy = digits.evaluate(model.net, x_val, y_val)
    return float(val_loss), float(accuracy)


# -- curves ----------------------------------------------------------------------------------


@dataclass
class Curve:
    """Best validation accuracy so far after each epoch spent (index = epochs - 1)."""

    best: list[float] = field(default_factory=list)
    trials: int = 0
    seconds: float = 0.0

    def add(self, accuracy: float) -> None:
        """Counts one epoch that validated at ``accuracy``."""
        self.best.append(max(accuracy, self.best[-1] if self.best else 0.0))

    @property
    def final(self) -> float:
        """The best accuracy at the end (0 when nothing trained)."""
        return self.best[-1] if self.best else 0.0

    def epochs_to(self, target: float) -> int | None:
        """Epochs spent until the best accuracy first reached ``target`` (``None``: never)."""
        for i, value in enumerate(self.best):
            if value >= target - 1e-12:
                return i + 1
        return None


# -- in-process methods: cairn's and Optuna's ------------------------------------------------


class Runner:
    """Trains trials one epoch at a time in turns, for cairn's methods and Optuna's."""

    def __init__(self, digits: Any, data: tuple[Any, ...]) -> None:
        self.digits = digits
        self.data = data

    def cairn(self, searcher: dict[str, Any], seed: int, budget: int) -> Curve:
        """Drives cairn's method until it shuts down or ``budget`` epochs are spent."""
        config = parse_config(
            {
                "searcher": {"metric": "validation_loss", **searcher},
                "hyperparameters": SPACE,
                "reproducibility": {"experiment_seed": seed},
            }
        )
        method = make_method(config)
        trials: dict[str, Model] = {}
        saved: dict[str, tuple[Any, Any, int]] = {}
        curve = Curve()
        started = time.perf_counter()

        def start(op: Create) -> None:
            hp = dict(op.hparams)
            if op.warm_start is not None:  # the clone has its parent's width, whatever drawn
                hp["hidden"] = width(saved[op.warm_start])
            model = build(self.digits, hp, op.trial_seed)
            if op.warm_start is not None:
                load_state(model, saved[op.warm_start], hp)
            trials[op.request_id] = model
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
            model = trials[request_id]
            loss, accuracy = train_epoch(self.digits, self.data, model)
            curve.add(accuracy)
            apply(method.on_validation(request_id, capped(loss), float(model.epochs)))
            if request_id in trials:
                uuid = f"{request_id}@{model.epochs}"
                saved[uuid] = save_state(model)
                apply(method.on_checkpoint(request_id, uuid, model.epochs))
            if request_id in trials and model.epochs >= MAX_EPOCHS:
                close(request_id)  # a trial's (or a PBT lineage's) full length
        curve.seconds = time.perf_counter() - started
        return curve

    def optuna_tpe(self, seed: int, budget: int) -> Curve:
        """Optuna's TPE sampler with its successive-halving pruner, by ask and tell: each epoch
        is reported, a pruned trial stops, a trial that trains ``MAX_EPOCHS`` is told its last
        loss; up to TPE's concurrency live at once, until ``budget`` epochs are spent."""
        import optuna
        from optuna.distributions import CategoricalDistribution, FloatDistribution
        from optuna.trial import TrialState

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = {
            "lr": FloatDistribution(10 ** LR[0], 10 ** LR[1], log=True),
            "weight_decay": FloatDistribution(
                10 ** WEIGHT_DECAY[0], 10 ** WEIGHT_DECAY[1], log=True
            ),
            "dropout": FloatDistribution(*DROPOUT),
            "hidden": CategoricalDistribution(HIDDEN),
            "batch_size": CategoricalDistribution(BATCH_SIZE),
        }
        study = optuna.create_study(
            direction="minimize",
            sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials()),
            pruner=optuna.pruners.SuccessiveHalvingPruner(
                min_resource=1, reduction_factor=DIVISOR, min_early_stopping_rate=0
            ),
        )
        live: dict[int, tuple[Any, Model]] = {}
        curve = Curve()
        started = time.perf_counter()

        def fill() -> None:
            while len(live) < CONCURRENCY["tpe"]:
                trial = study.ask(space)
                model = build(self.digits, trial.params, seed * 100_003 + trial.number)
                live[trial.number] = (trial, model)
                curve.trials += 1

        fill()
        while len(curve.best) < budget:
            number = min(live, key=lambda n: (live[n][1].epochs, n))
            trial, model = live[number]
            loss, accuracy = train_epoch(self.digits, self.data, model)
            curve.add(accuracy)
            trial.report(capped(loss), model.epochs)
            if trial.should_prune():
                study.tell(trial, state=TrialState.PRUNED)
                del live[number]
            elif model.epochs >= MAX_EPOCHS:
                study.tell(trial, capped(loss))
                del live[number]
            fill()
        curve.seconds = time.perf_counter() - started
        return curve


# -- Ray Tune --------------------------------------------------------------------------------


def _ray_trainable(config: dict[str, Any], data: tuple[Any, ...] | None = None) -> None:
    """One Ray Tune trial on the shared objective: an epoch per report, a checkpoint per
    epoch when PBT asks for them (``config["checkpoints"]``), resuming from one it is given."""
    import pickle

    import torch
    from ray import tune

    torch.set_num_threads(1)
    digits = load_digits_module()
    assert data is not None
    model = build(digits, config, int(config["trial_seed"]))
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = pickle.loads((Path(folder) / "state.pkl").read_bytes())
        load_state(model, state, config)
    while model.epochs < MAX_EPOCHS:
        loss, accuracy = train_epoch(digits, data, model)
        metrics = {
            "validation_loss": capped(loss),
            "accuracy": accuracy,
            "epoch": model.epochs,
            "reported_at": time.time(),
        }
        if config.get("checkpoints"):
            with tempfile.TemporaryDirectory() as folder:
                (Path(folder) / "state.pkl").write_bytes(pickle.dumps(save_state(model)))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(metrics)


def ray_search(kind: str, data: tuple[Any, ...], seed: int, budget: int) -> Curve:
    """Ray Tune's ASHA (``kind="asha"``) or PBT (``"pbt"``) on the shared objective, stopped
    once ``budget`` epochs are reported; the curve follows the reports' order.

    Raises:
        ImportError: ``ray[tune]`` is not installed.
    """
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
    from ray.tune.search.basic_variant import BasicVariantGenerator

    class Budget(tune.Stopper):  # type: ignore[misc]
        """Stops every trial once ``budget`` epochs are reported."""

        def __init__(self) -> None:
            self.reports = 0

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            self.reports += 1
            return False

        def stop_all(self) -> bool:
            return self.reports >= budget

    space: dict[str, Any] = {
        "lr": tune.loguniform(10 ** LR[0], 10 ** LR[1]),
        "weight_decay": tune.loguniform(10 ** WEIGHT_DECAY[0], 10 ** WEIGHT_DECAY[1]),
        "dropout": tune.uniform(*DROPOUT),
        "hidden": tune.choice(HIDDEN),
        "batch_size": tune.choice(BATCH_SIZE),
        "trial_seed": tune.randint(0, 2**31 - 1),
        "checkpoints": kind == "pbt",
    }
    scheduler: Any
    if kind == "asha":
        scheduler = ASHAScheduler(
            time_attr="epoch", max_t=MAX_EPOCHS, grace_period=1, reduction_factor=DIVISOR
        )
        samples, concurrency = budget, CONCURRENCY["asha"]
    else:
        random.seed(seed)  # PBT's explore draws from the random module
        scheduler = PopulationBasedTraining(
            time_attr="epoch",
            perturbation_interval=PBT_ROUND,
            hyperparam_mutations={
                "lr": space["lr"],
                "weight_decay": space["weight_decay"],
                "dropout": space["dropout"],
            },
            quantile_fraction=PBT_FRACTION,
            resample_probability=PBT_RESAMPLE,
            perturbation_factors=(1 + PBT_PERTURB, 1 - PBT_PERTURB),
        )
        # The whole population at once: pausing and resuming members costs Ray Tune far more
        # than their epochs (cairn's runner trains them in turns, which costs nothing).
        samples, concurrency = full_trials(), full_trials()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        ignore_reinit_error=True,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    for quiet in ("ray.tune.analysis.experiment_analysis", "ray.tune.schedulers.pbt"):
        # Trials never started once the budget is spent, and every PBT clone, log a line each.
        logging.getLogger(quiet).setLevel(logging.ERROR)
    try:
        started = time.perf_counter()
        tuner = tune.Tuner(
            tune.with_resources(
                tune.with_parameters(_ray_trainable, data=data), {"cpu": 2 / concurrency}
            ),
            param_space=space,
            tune_config=tune.TuneConfig(
                metric="validation_loss",
                mode="min",
                scheduler=scheduler,
                search_alg=BasicVariantGenerator(random_state=seed),
                num_samples=samples,
                max_concurrent_trials=concurrency,
                reuse_actors=kind == "asha",
                time_budget_s=RAY_SECONDS,
            ),
            run_config=tune.RunConfig(
                storage_path=tempfile.mkdtemp(prefix="cairn-bench-ray-"),
                stop=Budget(),
                verbose=0,
            ),
        )
        results = tuner.fit()
        seconds = time.perf_counter() - started
        reports: list[tuple[float, float]] = []
        trials = 0
        for result in results:
            frame = result.metrics_dataframe
            if frame is None or "accuracy" not in frame:
                continue
            trials += 1
            reports.extend(
                zip(frame["reported_at"].tolist(), frame["accuracy"].tolist(), strict=True)
            )
        curve = Curve(trials=trials, seconds=seconds)
        for _, accuracy in sorted(reports)[:budget]:
            curve.add(float(accuracy))
        return curve
    finally:
        ray.shutdown()


# -- figures ---------------------------------------------------------------------------------


def plot(curves: dict[str, list[Curve]], path: Path) -> str | None:
    """Median best-accuracy-so-far against epochs per method, as a PNG; ``None`` on success,
    else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (make bench installs requirements-bench.txt)"
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, runs in curves.items():
        runs = [c for c in runs if c.best]
        if not runs:
            continue
        length = max(len(c.best) for c in runs)
        median = [
            statistics.median(c.best[min(i, len(c.best) - 1)] for c in runs) for i in range(length)
        ]
        style = "--" if not name.startswith("cairn") else "-"
        ax.plot(range(1, length + 1), median, style, label=name)
    ax.set_xlabel("epochs spent")
    ax.set_ylabel("best validation accuracy so far (median over seeds)")
    ax.set_title(f"digits MLP, wide space: search methods at a budget of {BUDGET} epochs")
    ax.set_ylim(0.5, 1.0)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _fmt(value: float | None, pattern: str = "{:.0f}") -> str:
    return "-" if value is None else pattern.format(value)


def median_epochs_to(runs: list[Curve], targets: list[Curve]) -> tuple[float | None, int]:
    """Median epochs ``runs`` took to reach ``targets``' final best, seed by seed (the seeds both
    ran), over the seeds where they did; and on how many seeds they did."""
    got = [
        e for c, t in zip(runs, targets, strict=False) if (e := c.epochs_to(t.final)) is not None
    ]
    return (statistics.median(got) if got else None), len(got)


def speedup(runs: list[Curve], baseline: list[Curve]) -> float:
    """Median over the seeds both ran of (``baseline``'s epochs to its own best / ``runs``' epochs to it);
    a seed where ``runs`` never got there counts as 0x."""
    ratios = []
    for c, b in zip(runs, baseline, strict=False):
        base = b.epochs_to(b.final)
        mine = c.epochs_to(b.final)
        ratios.append(base / mine if base and mine else 0.0)
    return statistics.median(ratios)


def accuracy_measure(
    name: str, mine: list[Curve], peer: list[Curve], peer_label: str, *, goal: bool = True
) -> Measure:
    """Median best accuracy at the budget, a cairn method beside its peer, on the seeds both
    ran."""
    mine = mine[: len(peer)]
    cairn = statistics.median(c.final for c in mine)
    baseline = statistics.median(c.final for c in peer)
    wins = sum(m.final >= p.final for m, p in zip(mine, peer, strict=True))
    measure = Measure(
        name=f"search {name}: best accuracy at {BUDGET} epochs (median over seeds)",
        cairn=cairn,
        baseline=baseline,
        baseline_label=peer_label,
        unit="accuracy",
        count=len(mine),
        notes=f"cairn at least as good on {wins}/{len(mine)} seeds",
        target=">= 1.0x",
        met=cairn >= baseline,
    )
    measure.decimals = 4  # type: ignore[attr-defined]
    return measure


def epochs_measure(name: str, mine: list[Curve], peer: list[Curve], peer_label: str) -> Measure:
    """Peer's epochs to its own best / cairn's epochs to it (median over the seeds both ran)."""
    mine = mine[: len(peer)]
    value = speedup(mine, peer)
    got, reached = median_epochs_to(mine, peer)
    own, _ = median_epochs_to(peer, peer)
    measure = Measure(
        name=f"search {name}: speedup to {peer_label}'s best (its epochs / cairn's)",
        cairn=value,
        baseline=1.0,
        baseline_label=peer_label,
        unit="x",
        count=len(mine),
        notes=f"cairn reached it on {reached}/{len(mine)} seeds in {_fmt(got)} epochs "
        f"(median) vs {_fmt(own)}",
        target=">= 1.0x",
        met=value >= 1.0,
    )
    measure.decimals = 2  # type: ignore[attr-defined]
    return measure


async def run(ctx: BenchContext) -> Report:
    """The search benchmark against peers (no database needed)."""
    import torch

    torch.set_num_threads(1)
    digits = load_digits_module()
    data = digits.load_data()
    runner = Runner(digits, data)
    seeds = ctx.scaled(SEEDS, 2)
    limits: dict[str, int] = {}
    methods: dict[str, Callable[[int], Curve]] = {
        f"cairn {name}": (lambda seed, s=searcher: runner.cairn(s, seed, BUDGET))
        for name, searcher in searchers().items()
    }
    methods["optuna tpe+sha"] = lambda seed: runner.optuna_tpe(seed, BUDGET)
    notes: list[str] = []
    if RAY:
        try:
            import ray.tune  # noqa: F401

            methods["ray asha"] = lambda seed: ray_search("asha", data, seed, BUDGET)
            methods["ray pbt"] = lambda seed: ray_search("pbt", data, seed, BUDGET)
            limits["ray pbt"] = min(RAY_PBT_SEEDS, seeds)
        except ImportError as exc:
            notes.append(f"Ray Tune not run: ray[tune] is not installed ({exc})")
    else:
        notes.append("Ray Tune not run: CAIRN_BENCH_SEARCH_PEERS=0")
    progress(
        f"search: {len(methods)} methods x {seeds} seeds, {BUDGET} epochs each (at most "
        f"{MAX_EPOCHS} a trial), digits MLP in a wide space; load {load_average()}"
    )
    curves: dict[str, list[Curve]] = {name: [] for name in methods}
    for seed in range(1, seeds + 1):
        for name, method in methods.items():
            if seed > limits.get(name, seeds):
                continue
            curve = method(seed)
            curves[name].append(curve)
            progress(
                f"search: seed {seed} {name}: best {curve.final:.4f} after {len(curve.best)} "
                f"epochs, {curve.trials} trials, {curve.seconds:.1f}s"
            )
    names = list(curves)
    rows = []
    for name in names:
        runs = curves[name]
        rows.append(
            [
                name,
                str(len(runs)),
                f"{statistics.median(len(c.best) for c in runs):.0f}",
                f"{statistics.median(c.final for c in runs):.4f}",
                f"{min(c.final for c in runs):.4f}",
                _fmt(speedup(runs, curves["cairn random"]), "{:.2f}x"),
                f"{statistics.median(c.trials for c in runs):.0f}",
                f"{statistics.median(c.seconds for c in runs):.1f}",
            ]
        )
    print()
    print(
        f"Search against peers, digits MLP (wide space), {BUDGET} epochs per method, {seeds} "
        f"seeds, load {load_average()}:"
    )
    print_table(
        [
            "method",
            "seeds",
            "epochs",
            "best acc (median)",
            "worst seed",
            "speedup vs random",
            "trials",
            "wall s",
        ],
        rows,
    )
    matrix: dict[str, dict[str, list[Any]]] = {}
    matrix_rows = []
    for name in names:
        matrix[name] = {}
        cells = [name]
        for peer in names:
            got, reached = median_epochs_to(curves[name], curves[peer])
            matrix[name][peer] = [got, reached]
            cells.append(f"{_fmt(got)} ({reached}/{min(len(curves[name]), len(curves[peer]))})")
        matrix_rows.append(cells)
    print("\nEpochs (median) each method (row) took to reach each method's best (column), and on")
    print("how many seeds it did:")
    print_table(["method \\ best of", *names], matrix_rows)

    measures = []
    asha = speedup(curves["cairn asha"], curves["cairn random"])
    got, reached = median_epochs_to(curves["cairn asha"], curves["cairn random"])
    own, _ = median_epochs_to(curves["cairn random"], curves["cairn random"])
    random_to_asha = Measure(
        name="search: random-to-ASHA speedup (random's epochs to its best / ASHA's, median)",
        cairn=asha,
        baseline=1.0,
        baseline_label="cairn random search",
        unit="x",
        count=seeds,
        notes=f"ASHA reached random's best on {reached}/{seeds} seeds in {_fmt(got)} epochs "
        f"(median) vs random's {_fmt(own)}",
        target=">= 3x",
        met=asha >= 3.0,
    )
    random_to_asha.decimals = 2  # type: ignore[attr-defined]
    measures.append(random_to_asha)
    pairs = [
        ("asha", "cairn asha", "ray asha", "Ray Tune ASHA"),
        ("tpe", "cairn tpe", "optuna tpe+sha", "Optuna TPE + SHA pruner"),
        ("pbt", "cairn pbt", "ray pbt", "Ray Tune PBT"),
    ]
    for label, mine, peer, peer_label in pairs:
        if peer not in curves:
            continue
        measures.append(accuracy_measure(label, curves[mine], curves[peer], peer_label))
        measures.append(epochs_measure(label, curves[mine], curves[peer], peer_label))
    png = RESULTS / "search_efficiency.png"
    why = plot(curves, png)
    if why is None:
        print(f"plot: {png}")
    else:
        print(f"plot: not drawn, {why}")
        notes.append(f"plot not drawn: {why}")
    notes.append(f"load average at the end: {load_average()}")
    return Report(
        measures=measures,
        details={
            "budget_epochs": BUDGET,
            "max_epochs_per_trial": MAX_EPOCHS,
            "seeds": seeds,
            "space": SPACE,
            "searchers": searchers(),
            "best_accuracy": {n: [c.final for c in runs] for n, runs in curves.items()},
            "trials": {n: [c.trials for c in runs] for n, runs in curves.items()},
            "seconds": {n: [c.seconds for c in runs] for n, runs in curves.items()},
            "epochs_to_best_of": matrix,
            "curves": {n: [c.best for c in runs] for n, runs in curves.items()},
        },
        notes=notes,
    )
