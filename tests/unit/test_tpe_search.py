"""TPE search: Optuna's sampler behind the method protocol, deterministic and rebuildable."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from optuna.trial import TrialState

from events.domain.config import ConfigError, ExperimentConfig, parse_config
from events.domain.config.limits import MAX_TPE_TRIALS
from events.domain.search import Create, SearcherError, SearchMethod, Shutdown, make_method
from events.domain.search.tpe import TPEStrategy

HPS: dict[str, Any] = {
    "lr": {"type": "log", "minval": -5, "maxval": -1, "base": 10},
    "width": {"type": "int", "minval": 4, "maxval": 9},
    "drop": {"type": "double", "minval": 0.0, "maxval": 1.0},
    "opt": {
        "kind": {"type": "categorical", "vals": [{"name": "adam"}, ["sgd", 0.9], None]},
        "beta": 0.9,
    },
}


def tpe_config(
    seed: int = 11, hps: dict[str, Any] | None = None, **searcher: Any
) -> ExperimentConfig:
    raw = {
        "searcher": {"name": "tpe", "metric": "loss", "max_trials": 30, **searcher},
        "hyperparameters": HPS if hps is None else hps,
    }
    return parse_config(raw, default_seed=seed)


def strategy(method: SearchMethod) -> TPEStrategy:
    assert isinstance(method.strategy, TPEStrategy)
    return method.strategy


def objective(hparams: dict[str, Any]) -> float:
    """Best at drop = 0.2 and lr = 1e-3 (a space without them scores 0)."""
    drop, lr = hparams.get("drop", 0.2), hparams.get("lr", 1e-3)
    return (drop - 0.2) ** 2 + (math.log10(lr) + 3) ** 2 / 16


def run_serially(method: SearchMethod, fail: dict[int, str] | None = None) -> list[Create]:
    """One trial at a time: each reports objective() once and closes (or exits early)."""
    fail = fail or {}
    made: list[Create] = []
    queue = [op for op in method.initial_operations() if isinstance(op, Create)]
    while queue:
        op = queue.pop(0)
        made.append(op)
        reason = fail.get(len(made) - 1)
        if reason is not None:
            method.on_trial_exited_early(op.request_id, reason)
        else:
            method.on_validation(op.request_id, objective(op.hparams), 1.0)
        ops = method.on_trial_closed(op.request_id)
        queue += [o for o in ops if isinstance(o, Create)]
    assert method.is_shutdown
    return made


def test_hyperparameters_map_to_their_types_and_ranges() -> None:
    """int, double, log, categorical (any JSON value) and const come back typed, in range, nested."""
    made = run_serially(make_method(tpe_config(n_startup_trials=5)))
    assert len(made) == 30
    for op in made:
        hp = op.hparams
        assert set(hp) == {"lr", "width", "drop", "opt"}
        assert isinstance(hp["width"], int) and 4 <= hp["width"] <= 9
        assert isinstance(hp["drop"], float) and 0.0 <= hp["drop"] <= 1.0
        assert 1e-5 * (1 - 1e-9) <= hp["lr"] <= 1e-1 * (1 + 1e-9)
        assert hp["opt"]["beta"] == 0.9
        assert hp["opt"]["kind"] in ({"name": "adam"}, ["sgd", 0.9], None)
    assert {json.dumps(op.hparams["opt"]["kind"]) for op in made} == {
        '{"name": "adam"}',
        '["sgd", 0.9]',
        "null",
    }


def test_tpe_concentrates_near_the_optimum_after_startup() -> None:
    """After the random startup trials, TPE's suggestions are closer to the optimum on average."""
    made = run_serially(make_method(tpe_config(n_startup_trials=8, max_trials=40)))
    startup = [objective(op.hparams) for op in made[:8]]
    guided = [objective(op.hparams) for op in made[-12:]]
    assert sum(guided) / len(guided) < sum(startup) / len(startup) / 2


def test_larger_is_better_is_told_as_maximize() -> None:
    """smaller_is_better: false makes the study maximize the metric."""
    method = make_method(tpe_config(smaller_is_better=False))
    method.initial_operations()
    study = strategy(method).study
    assert study is not None and study.direction.name == "MAXIMIZE"


def test_trials_without_a_usable_result_are_told_as_failed() -> None:
    """Errored-without-metric and invalid_hp trials are FAIL; invalid_hp gives its place back."""
    method = make_method(tpe_config(max_trials=6, n_startup_trials=2))
    made = run_serially(method, fail={1: "errored", 3: "invalid_hp"})
    assert len(made) == 7, "the invalid_hp trial was replaced, the errored one was not"
    study = strategy(method).study
    assert study is not None
    states = [t.state for t in study.trials]
    assert states[1] == TrialState.FAIL and states[3] == TrialState.FAIL
    assert states.count(TrialState.COMPLETE) == 5


def test_non_finite_metric_is_told_as_failed() -> None:
    """A NaN metric does not reach the sampler as a value."""
    method = make_method(tpe_config(max_trials=1, n_startup_trials=1))
    (op,) = method.initial_operations()
    assert isinstance(op, Create)
    method.on_validation(op.request_id, math.nan, 1.0)
    assert method.on_trial_closed(op.request_id) == [Shutdown()]
    study = strategy(method).study
    assert study is not None and study.trials[0].state == TrialState.FAIL


def test_same_seed_same_suggestions_different_seed_different() -> None:
    """The experiment seed alone decides the suggestions."""
    one = [op.hparams for op in run_serially(make_method(tpe_config(seed=3)))]
    two = [op.hparams for op in run_serially(make_method(tpe_config(seed=3)))]
    other = [op.hparams for op in run_serially(make_method(tpe_config(seed=4)))]
    assert one == two
    assert one != other


def test_restore_rebuilds_the_study_and_suggests_what_an_unbroken_run_would() -> None:
    """Restoring a JSON snapshot after the TPE phase started re-asks/tells and continues identically."""
    straight = run_serially(make_method(tpe_config(n_startup_trials=4, max_trials=12)))
    method = make_method(tpe_config(n_startup_trials=4, max_trials=12))
    made: list[Create] = []
    queue = [op for op in method.initial_operations() if isinstance(op, Create)]
    while queue:
        op = queue.pop(0)
        made.append(op)
        method.on_validation(op.request_id, objective(op.hparams), 1.0)
        ops = method.on_trial_closed(op.request_id)
        queue += [o for o in ops if isinstance(o, Create)]
        if len(made) == 7:
            saved = json.loads(json.dumps(method.snapshot()))
            method = make_method(tpe_config(n_startup_trials=4, max_trials=12))
            method.restore(saved)
            assert method.snapshot() == saved
    assert [op.hparams for op in made] == [op.hparams for op in straight]
    assert [op.trial_seed for op in made] == [op.trial_seed for op in straight]


def test_restore_refuses_a_history_the_sampler_does_not_reproduce() -> None:
    """A snapshot whose recorded suggestion differs from the rebuilt one is rejected."""
    method = make_method(tpe_config())
    method.initial_operations()
    saved = json.loads(json.dumps(method.snapshot()))
    saved["strategy"]["history"][0][2]["drop"] = 2.5
    with pytest.raises(SearcherError, match="rebuilding the TPE study"):
        make_method(tpe_config()).restore(saved)


def test_constant_only_search_space_still_runs() -> None:
    """With nothing to sample every trial gets the constants."""
    made = run_serially(make_method(tpe_config(hps={"a": 1}, max_trials=3, n_startup_trials=1)))
    assert [op.hparams for op in made] == [{"a": 1}] * 3


@pytest.mark.parametrize(
    ("knobs", "path"),
    [
        ({"n_startup_trials": 31}, "searcher.n_startup_trials"),
        ({"n_startup_trials": 0}, "searcher.n_startup_trials"),
        ({"max_trials": MAX_TPE_TRIALS + 1}, "searcher.max_trials"),
        ({"max_trials": 0}, "searcher.max_trials"),
        ({"max_concurrent_trials": -1}, "searcher.max_concurrent_trials"),
        ({"num_rungs": 3}, "searcher.num_rungs"),
    ],
)
def test_bad_tpe_knobs_are_rejected_at_their_path(knobs: dict[str, Any], path: str) -> None:
    """Each bad knob is reported at its own dotted path."""
    with pytest.raises(ConfigError) as info:
        tpe_config(**knobs)
    assert info.value.paths() == [path], str(info.value)
