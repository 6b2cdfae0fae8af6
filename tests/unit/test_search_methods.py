"""Search methods driven by scripted trials: decisions, budgets, determinism, snapshots."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from events.domain.config import AdaptiveASHASearcher, ExperimentConfig, parse_config
from events.domain.config.hyperparameters import iter_leaves
from events.domain.search import (
    Create,
    Operation,
    SearcherError,
    SearchMethod,
    Shutdown,
    Stop,
    adaptive_brackets,
    make_method,
    read_validation,
)
from events.domain.search.adaptive_asha import (
    bracket_max_concurrent,
    bracket_max_trials,
    bracket_rungs_for,
    max_rungs_for,
)
from events.domain.search.asha import rung_units
from events.domain.search.sampling import grid_axis, grid_points, grid_size, sample_hparams

HPS = {
    "lr": {"type": "log", "minval": -4, "maxval": -1},
    "width": {"type": "int", "minval": 8, "maxval": 64},
    "drop": {"type": "double", "minval": 0.0, "maxval": 0.5},
    "opt": {"name": {"type": "categorical", "vals": ["adam", "sgd"]}, "beta": 0.9},
}


def config(
    searcher: dict[str, Any], hps: dict[str, Any] | None = None, seed: int = 7
) -> ExperimentConfig:
    raw = {
        "searcher": {"metric": "loss", **searcher},
        "hyperparameters": HPS if hps is None else hps,
    }
    return parse_config(raw, default_seed=seed)


def asha(**kw: Any) -> ExperimentConfig:
    base = {"name": "async_halving", "max_trials": 4, "num_rungs": 2, "divisor": 2}
    return config({**base, "time_metric": "batches", "max_time": 8, **kw})


def creates(ops: list[Operation]) -> list[str]:
    return [op.request_id for op in ops if isinstance(op, Create)]


class Driver:
    """Plays trials against a method: each live trial in turn reports its next validation.

    ``metric(index, t)`` gives the metric of the index-th created trial at time t. Trials report
    every ``period`` units until ``length``; then they exit on their own. Trials whose index is in
    ``fail`` exit early with that reason at their first report.
    """

    def __init__(
        self,
        method: SearchMethod,
        metric: Callable[[int, int], float],
        period: int,
        length: int,
        fail: dict[int, str] | None = None,
    ) -> None:
        self.method = method
        self.metric = metric
        self.period = period
        self.length = length
        self.fail = fail or {}
        self.index: dict[str, int] = {}
        self.time: dict[str, int] = {}
        self.live: list[str] = []
        self.log: list[tuple[str, Any]] = []
        self.hparams: dict[str, dict[str, Any]] = {}
        self.max_live = 0
        self.shutdown: Shutdown | None = None

    def apply(self, ops: list[Operation]) -> None:
        for op in ops:
            self.log.append((type(op).__name__, op))
            if isinstance(op, Create):
                self.index[op.request_id] = len(self.index)
                self.hparams[op.request_id] = op.hparams
                self.time[op.request_id] = 0
                self.live.append(op.request_id)
                self.apply(self.method.on_trial_created(op.request_id))
            elif isinstance(op, Stop):
                self.close(op.request_id)
            else:
                assert self.shutdown is None, "Shutdown returned twice"
                self.shutdown = op
        self.max_live = max(self.max_live, len(self.live))

    def close(self, request_id: str) -> None:
        if request_id in self.live:
            self.live.remove(request_id)
            self.apply(self.method.on_trial_closed(request_id))

    def start(self) -> None:
        self.apply(self.method.initial_operations())

    def step(self) -> bool:
        """Advances the first live trial by one report; False once nothing is live."""
        if not self.live:
            return False
        rid = self.live[0]
        self.live.append(self.live.pop(0))
        index = self.index[rid]
        if index in self.fail:
            self.apply(self.method.on_trial_exited_early(rid, self.fail[index]))
            self.close(rid)
            return True
        self.time[rid] += self.period
        t = self.time[rid]
        self.apply(self.method.on_validation(rid, self.metric(index, t), float(t)))
        if rid in self.live and t >= self.length:
            self.close(rid)
        return True

    def run(self, limit: int = 100_000) -> Driver:
        self.start()
        for _ in range(limit):
            if not self.step():
                break
        return self


def stops(driver: Driver) -> dict[int, int]:
    """Trial index -> time at which the searcher stopped it."""
    out = {}
    for kind, op in driver.log:
        if kind == "Stop":
            out[driver.index[op.request_id]] = driver.time[op.request_id]
    return out


# -- ASHA ----------------------------------------------------------------------------------


def test_rungs_are_max_time_over_powers_of_the_divisor() -> None:
    """Rung i sits at floor(max_time / divisor^(n-1-i)), at least 1."""
    assert rung_units(3, 4.0, 937) == [58, 234, 937]
    assert rung_units(4, 2.0, 8) == [1, 2, 4, 8]
    assert rung_units(3, 10.0, 5) == [1, 1, 5]


def test_asha_stops_trials_outside_the_top_fraction_of_each_rung() -> None:
    """Scripted metrics: exactly the trials ranking below 1/divisor at a rung are stopped there."""
    method = make_method(asha())
    ops = method.initial_operations()
    r1, r2, r3, r4 = creates(ops)
    assert method.on_validation(r1, 0.5, 4.0) == []  # best so far continues
    assert method.on_validation(r2, 0.7, 4.0) == [Stop(r2)]  # 2nd of 2, keeps 1
    assert method.on_validation(r3, 0.3, 4.0) == []  # new best, keeps 1 of 3
    assert method.on_validation(r4, 0.6, 4.0) == [Stop(r4)]  # 3rd of 4, keeps 2
    assert method.on_validation(r1, 0.4, 6.0) == []  # between rungs: nothing
    assert method.on_validation(r1, 0.4, 8.0) == [Stop(r1)]  # top rung always stops
    assert method.on_validation(r3, 0.2, 8.0) == [Stop(r3)]
    assert [method.on_trial_closed(r) for r in (r1, r2, r3)] == [[], [], []]
    assert method.on_trial_closed(r4) == [Shutdown()]


def test_larger_is_better_flips_the_ranking() -> None:
    """With smaller_is_better false the higher metric survives."""
    method = make_method(asha(smaller_is_better=False))
    r1, r2, *_ = creates(method.initial_operations())
    assert method.on_validation(r1, 0.5, 4.0) == []
    assert method.on_validation(r2, 0.4, 4.0) == [Stop(r2)]


def test_one_report_can_pass_several_rungs() -> None:
    """A first validation beyond the top rung records every rung and stops the trial."""
    method = make_method(asha(num_rungs=3, max_time=16))
    r1, *_ = creates(method.initial_operations())
    assert method.on_validation(r1, 1.0, 100.0) == [Stop(r1)]
    state = method.snapshot()["strategy"]
    assert [len(rung["metrics"]) for rung in state["rungs"]] == [1, 1, 1]


def test_asha_simulation_stops_each_trial_at_its_rung() -> None:
    """Improving-then-worsening metrics: which trial stops at which rung, end to end."""
    # Trials 0..7; quality order (lower is better): 3 < 0 < 5 < 1 < 6 < 2 < 7 < 4.
    quality = [2.0, 4.0, 6.0, 1.0, 8.0, 3.0, 5.0, 7.0]
    cfg = asha(max_trials=8, max_concurrent_trials=8, num_rungs=3, max_time=16)
    driver = Driver(make_method(cfg), lambda i, t: quality[i], period=4, length=16).run()
    # Rungs at 4, 8, 16; all 8 trials report at t=4 in creation order.
    assert stops(driver) == {0: 16, 1: 4, 2: 4, 3: 16, 4: 4, 5: 8, 6: 4, 7: 4}
    assert isinstance(driver.shutdown, Shutdown) and not driver.shutdown.failure
    assert len(driver.index) == 8


def test_asha_replaces_stopped_trials_until_max_trials_within_concurrency() -> None:
    """New trials appear as others stop, never beyond max_concurrent_trials or max_trials."""
    cfg = asha(max_trials=10, max_concurrent_trials=3, num_rungs=3, max_time=16)
    rng = random.Random(3)
    quality = [rng.random() for _ in range(10)]
    driver = Driver(make_method(cfg), lambda i, t: quality[i], period=4, length=16).run()
    assert len(driver.index) == 10
    assert driver.max_live == 3
    assert driver.shutdown == Shutdown()
    assert driver.method.progress() == 1.0


def test_asha_errored_trial_ranks_worst_and_gets_a_replacement() -> None:
    """An errored trial counts as the worst in its rung and a new trial takes its place."""
    method = make_method(asha(max_trials=3, max_concurrent_trials=2))
    r1, r2 = creates(method.initial_operations())
    assert method.on_trial_exited_early(r2, "errored") == []
    (r3,) = creates(method.on_trial_closed(r2))  # replacement, released as r2 frees its place
    assert method.on_validation(r1, 9.0, 4.0) == []  # beats the errored trial's worst value
    assert method.on_validation(r3, 10.0, 4.0) == [Stop(r3)]  # 2nd of 3 keeps only 1
    rung0 = method.snapshot()["strategy"]["rungs"][0]["metrics"]
    assert [m[0] for m in rung0] == [r1, r3, r2]


def test_asha_invalid_hp_trial_is_forgotten_and_does_not_use_the_budget() -> None:
    """An invalid_hp trial leaves every rung and is replaced beyond max_trials."""
    method = make_method(asha(max_trials=2, max_concurrent_trials=2))
    r1, r2 = creates(method.initial_operations())
    assert method.on_validation(r1, 1.0, 4.0) == []
    assert method.on_trial_exited_early(r1, "invalid_hp") == []
    (r3,) = creates(method.on_trial_closed(r1))
    rungs = method.snapshot()["strategy"]["rungs"]
    assert all(m[0] != r1 for rung in rungs for m in rung["metrics"])
    assert r3 not in (r1, r2)


def test_asha_requires_a_time_value() -> None:
    """A validation without the time metric is an error and changes nothing."""
    method = make_method(asha())
    r1, *_ = creates(method.initial_operations())
    before = method.snapshot()
    with pytest.raises(SearcherError):
        method.on_validation(r1, 1.0, None)
    assert method.snapshot() == before


# -- adaptive ASHA -------------------------------------------------------------------------


def test_adaptive_brackets_for_the_mnist_example() -> None:
    """max_trials 16, max_time 937, divisor 4: brackets of 3 and 2 rungs with 12 and 4 trials."""
    assert max_rungs_for(5, 4.0, 937, 16) == 3
    assert bracket_rungs_for("standard", 3) == [3, 2]
    assert bracket_rungs_for("aggressive", 3) == [3]
    assert bracket_rungs_for("conservative", 3) == [3, 2, 1]
    assert bracket_max_trials(16, 4.0, [3, 2]) == [12, 4]
    assert bracket_max_concurrent(16, 4.0, [12, 4]) == [8, 8]
    assert bracket_max_concurrent(3, 4.0, [5, 3]) == [2, 1]
    assert bracket_max_concurrent(0, 4.0, [5, 3]) == [4, 4]
    cfg = config(
        {"name": "adaptive_asha", "max_trials": 16, "time_metric": "batches", "max_time": 937}
    )
    assert isinstance(cfg.searcher, AdaptiveASHASearcher)
    brackets = adaptive_brackets(cfg.searcher)
    assert [(b.num_rungs, b.max_trials, b.units) for b in brackets] == [
        (3, 12, [58, 234, 937]),
        (2, 4, [234, 937]),
    ]


def test_explicit_bracket_rungs_override_the_mode() -> None:
    """bracket_rungs picks the bracket depths directly (deepest first)."""
    cfg = config(
        {
            "name": "adaptive_asha",
            "max_trials": 20,
            "max_length": 1000,
            "bracket_rungs": [1, 4],
            "mode": "aggressive",
        }
    )
    assert isinstance(cfg.searcher, AdaptiveASHASearcher)
    assert [b.num_rungs for b in adaptive_brackets(cfg.searcher)] == [4, 1]


def test_adaptive_search_runs_to_completion_with_every_trial() -> None:
    """All max_trials trials run, each routed to one bracket, then the search shuts down."""
    cfg = config(
        {
            "name": "adaptive_asha",
            "max_trials": 16,
            "max_concurrent_trials": 4,
            "time_metric": "batches",
            "max_time": 937,
        }
    )
    rng = random.Random(5)
    quality = [rng.random() for _ in range(16)]
    driver = Driver(make_method(cfg), lambda i, t: quality[i], period=58, length=937).run()
    assert len(driver.index) == 16
    assert driver.max_live <= 4
    assert driver.shutdown == Shutdown()


# -- random, single, grid ------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 30), st.integers(0, 8), st.integers(0, 2**32 - 1))
def test_random_respects_max_trials_and_max_concurrent(trials: int, cap: int, seed: int) -> None:
    """Random search creates exactly max_trials, never more than the cap at once (0: no cap)."""
    cfg = config({"name": "random", "max_trials": trials, "max_concurrent_trials": cap}, seed=seed)
    driver = Driver(make_method(cfg), lambda i, t: 1.0, period=1, length=2).run()
    assert len(driver.index) == trials
    assert driver.max_live == (min(trials, cap) if cap else trials)
    assert driver.shutdown == Shutdown()


def test_random_errored_trials_use_their_place_but_invalid_hp_is_replaced() -> None:
    """Errored trials count against max_trials; invalid_hp trials get an extra replacement."""
    cfg = config({"name": "random", "max_trials": 5, "max_concurrent_trials": 2})
    fail = {0: "errored", 2: "invalid_hp", 3: "invalid_hp"}
    driver = Driver(make_method(cfg), lambda i, t: 1.0, period=1, length=1, fail=fail).run()
    assert len(driver.index) == 7
    assert driver.shutdown == Shutdown()


def test_shutdown_reports_failure_or_cancel_when_every_trial_ended_that_way() -> None:
    """All trials errored -> Shutdown(failure); all canceled -> Shutdown(cancel)."""
    for reason, expected in (
        ("errored", Shutdown(failure=True)),
        ("user_canceled", Shutdown(cancel=True)),
    ):
        cfg = config({"name": "random", "max_trials": 3, "max_concurrent_trials": 1})
        fail = {i: reason for i in range(3)}
        driver = Driver(make_method(cfg), lambda i, t: 1.0, period=1, length=1, fail=fail).run()
        assert driver.shutdown == expected


def test_single_runs_one_trial() -> None:
    """Single search creates one trial and shuts down when it closes."""
    method = make_method(config({"name": "single"}))
    (rid,) = creates(method.initial_operations())
    assert method.on_trial_closed(rid) == [Shutdown()]
    assert method.is_shutdown and method.progress() == 1.0


def test_single_replaces_an_invalid_hp_trial_only_when_a_new_draw_can_differ() -> None:
    """invalid_hp: a random space gets a new trial; an all-constant space ends the search."""
    random_space = make_method(config({"name": "single"}))
    (rid,) = creates(random_space.initial_operations())
    assert random_space.on_trial_exited_early(rid, "invalid_hp") == []
    assert len(creates(random_space.on_trial_closed(rid))) == 1
    constant = make_method(
        config({"name": "single"}, {"lr": 0.1, "k": {"type": "categorical", "vals": [3]}})
    )
    (rid,) = creates(constant.initial_operations())
    assert constant.on_trial_exited_early(rid, "invalid_hp") == []
    assert constant.on_trial_closed(rid) == [Shutdown()]


def test_grid_axes_follow_determined_grid_math() -> None:
    """count spacing, int clamping/rounding/dedup, midpoint for count 1, log base, categorical."""
    cfg = config(
        {"name": "grid"},
        {
            "a": {"type": "int", "minval": 1, "maxval": 3, "count": 10},
            "b": {"type": "int", "minval": 0, "maxval": 9, "count": 4},
            "c": {"type": "int", "minval": 0, "maxval": 5, "count": 1},
            "d": {"type": "double", "minval": 0, "maxval": 1, "count": 3},
            "e": {"type": "log", "minval": -3, "maxval": -1, "count": 3, "base": 10},
            "f": {"type": "categorical", "vals": ["x", "y"]},
            "g": 7,
        },
    )
    axis = {path[-1]: grid_axis(hp) for path, hp in iter_leaves(cfg.hyperparameters)}
    assert axis["a"] == [1, 2, 3]
    assert axis["b"] == [0, 3, 6, 9]
    assert axis["c"] == [3]  # (0 + 5) / 2 rounds half away from zero
    assert axis["d"] == [0.0, 0.5, 1.0]
    assert axis["e"] == pytest.approx([0.001, 0.01, 0.1])
    assert axis["f"] == ["x", "y"] and axis["g"] == [7]
    assert grid_size(cfg.hyperparameters) == 3 * 4 * 1 * 3 * 3 * 2 * 1


def test_grid_search_runs_every_point_once_with_nested_groups() -> None:
    """Each grid point (nested groups rebuilt) becomes exactly one trial, cap respected."""
    hps = {
        "opt": {"lr": {"type": "double", "minval": 0.1, "maxval": 0.3, "count": 3}, "m": 0.9},
        "k": {"type": "categorical", "vals": [1, 2]},
    }
    cfg = config({"name": "grid", "max_concurrent_trials": 2}, hps)
    driver = Driver(make_method(cfg), lambda i, t: 1.0, period=1, length=1).run()
    seen = sorted(json.dumps(h, sort_keys=True) for h in driver.hparams.values())
    expected = sorted(json.dumps(p, sort_keys=True) for p in grid_points(cfg.hyperparameters))
    assert seen == expected and len(seen) == 6
    assert {"k": 1, "opt": {"lr": 0.1, "m": 0.9}} in driver.hparams.values()
    assert driver.max_live == 2 and driver.shutdown == Shutdown()


# -- sampling ------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.integers(-50, 50), st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_int_samples_cover_the_inclusive_range(lo: int, span: int, seed: int) -> None:
    """Sampled ints stay in [minval, maxval] and both ends can come up."""
    cfg = config({"name": "single"}, {"n": {"type": "int", "minval": lo, "maxval": lo + span}})
    rng = random.Random(seed)
    values = {sample_hparams(cfg.hyperparameters, rng)["n"] for _ in range(40 * (span + 1))}
    assert values == set(range(lo, lo + span + 1))


def test_log_and_double_samples_stay_in_range() -> None:
    """log = base ** U(minval, maxval); double = U(minval, maxval)."""
    cfg = config({"name": "single"})
    rng = random.Random(0)
    for _ in range(200):
        hp = sample_hparams(cfg.hyperparameters, rng)
        assert 1e-4 <= hp["lr"] <= 1e-1 and 0.0 <= hp["drop"] <= 0.5
        assert hp["opt"]["name"] in ("adam", "sgd") and hp["opt"]["beta"] == 0.9


def test_sampling_ignores_key_order() -> None:
    """The same seed samples the same values whatever order the config lists its keys in."""
    forward = config({"name": "single"})
    backward = config({"name": "single"}, dict(reversed(list(HPS.items()))))
    one, two = random.Random(11), random.Random(11)
    assert sample_hparams(forward.hyperparameters, one) == sample_hparams(
        backward.hyperparameters, two
    )


# -- determinism and snapshots -------------------------------------------------------------

SEARCHERS = {
    "random": {"name": "random", "max_trials": 9, "max_concurrent_trials": 3},
    "grid": {"name": "grid", "max_concurrent_trials": 2},
    "asha": {
        "name": "async_halving",
        "max_trials": 12,
        "num_rungs": 3,
        "max_concurrent_trials": 4,
        "time_metric": "batches",
        "max_time": 16,
    },
    "adaptive": {
        "name": "adaptive_asha",
        "max_trials": 12,
        "max_concurrent_trials": 5,
        "mode": "conservative",
        "max_length": 16,
    },
    "tpe": {"name": "tpe", "max_trials": 9, "max_concurrent_trials": 3, "n_startup_trials": 3},
}
GRID_HPS = {
    "lr": {"type": "log", "minval": -4, "maxval": -1, "count": 3},
    "width": {"type": "int", "minval": 8, "maxval": 64, "count": 3},
}
FAIL = {2: "errored", 5: "invalid_hp", 7: "user_canceled"}


def make(kind: str, seed: int = 7) -> SearchMethod:
    return make_method(config(SEARCHERS[kind], GRID_HPS if kind == "grid" else None, seed=seed))


def metric(i: int, t: int) -> float:
    return math.sin(i * 1.7) + 1.0 / (1 + t)


def scripted(kind: str, seed: int = 7) -> Driver:
    return Driver(make(kind, seed), metric, period=4, length=16, fail=FAIL)


@pytest.mark.parametrize("kind", sorted(SEARCHERS))
def test_same_seed_and_calls_give_identical_trials_and_snapshots(kind: str) -> None:
    """Two runs with one seed and one call order produce the same ops, hparams and snapshot."""
    first, second = scripted(kind).run(), scripted(kind).run()
    assert first.log == second.log
    assert first.hparams == second.hparams
    assert first.method.snapshot() == second.method.snapshot()
    assert first.shutdown is not None


@pytest.mark.parametrize("kind", ["random", "asha", "adaptive", "tpe"])
def test_a_different_seed_samples_different_trials(kind: str) -> None:
    """The experiment seed drives hyperparameters and trial seeds."""
    one, two = scripted(kind, seed=1).run(), scripted(kind, seed=2).run()
    assert one.hparams != two.hparams
    seeds = [op.trial_seed for kind_, op in one.log if kind_ == "Create"]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**31 for s in seeds)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(SEARCHERS)), st.integers(0, 60))
def test_restore_mid_run_continues_exactly_like_an_uninterrupted_run(kind: str, cut: int) -> None:
    """snapshot -> JSON -> fresh method -> restore, then continuing gives the same trials."""
    straight = scripted(kind).run()
    resumed = scripted(kind)
    resumed.start()
    for _ in range(cut):
        resumed.step()
    saved = json.loads(json.dumps(resumed.method.snapshot()))
    fresh = make(kind)
    fresh.restore(saved)
    assert fresh.snapshot() == saved
    resumed.method = fresh
    for _ in range(100_000):
        if not resumed.step():
            break
    assert resumed.log == straight.log
    assert resumed.method.snapshot() == straight.method.snapshot()


def test_restore_rejects_a_snapshot_of_another_method() -> None:
    """A snapshot only loads into a method of the same kind."""
    with pytest.raises(SearcherError):
        make("grid").restore(make("random").snapshot())


@pytest.mark.parametrize("kind", sorted(SEARCHERS))
def test_progress_never_drops_and_ends_at_one(kind: str) -> None:
    """progress() is monotone over a run and reaches 1 at shutdown."""
    driver = scripted(kind)
    driver.start()
    seen = [driver.method.progress()]
    while driver.step():
        seen.append(driver.method.progress())
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(seen))


# -- protocol edges ------------------------------------------------------------------------


def test_unknown_request_ids_and_repeated_events() -> None:
    """Unknown ids raise; repeated exits/closes and late validations are ignored."""
    method = make_method(config({"name": "random", "max_trials": 2, "max_concurrent_trials": 2}))
    r1, r2 = creates(method.initial_operations())
    with pytest.raises(SearcherError):
        method.on_validation("r9999", 1.0, 1.0)
    with pytest.raises(SearcherError):
        method.on_trial_exited_early(r1, "exploded")
    assert method.on_trial_exited_early(r1, "errored") == []
    assert method.on_trial_exited_early(r1, "errored") == []
    assert method.on_trial_closed(r1) == []
    assert method.on_trial_closed(r1) == []
    assert method.on_validation(r1, 1.0, 1.0) == []
    assert method.on_trial_closed(r2) == [Shutdown()]
    with pytest.raises(SearcherError):
        method.initial_operations()


def test_request_ids_count_up_in_request_order() -> None:
    """Request ids are r0001, r0002, ... in the order trials are requested."""
    method = make_method(config({"name": "random", "max_trials": 3}))
    assert creates(method.initial_operations()) == ["r0001", "r0002", "r0003"]


def test_read_validation_finds_metric_and_time_value() -> None:
    """The searcher metric and time axis come from the report, batches falling back to steps."""
    cfg = asha()
    assert read_validation(cfg.searcher, {"loss": 0.5, "batches": 8}) == (0.5, 8.0)
    assert read_validation(cfg.searcher, {"loss": 0.5}, steps_completed=12) == (0.5, 12.0)
    with pytest.raises(SearcherError):
        read_validation(cfg.searcher, {"loss": 0.5})
    with pytest.raises(SearcherError):
        read_validation(cfg.searcher, {"accuracy": 0.5, "batches": 8})
    epochs = config({"name": "random", "max_trials": 1, "max_length": {"epochs": 3}})
    assert read_validation(epochs.searcher, {"loss": 1, "epochs": 2}) == (1.0, 2.0)
    assert read_validation(config({"name": "single"}).searcher, {"loss": 2}) == (2.0, None)
