"""The search benchmark's harness: every method pays the same budget in epochs, and its figures
(epochs to a best, speedups) are computed as its docstring says."""

from __future__ import annotations

import pytest

from bench import search
from bench.search import Curve, median_epochs_to, speedup


def _curve(*best: float) -> Curve:
    curve = Curve()
    for value in best:
        curve.add(value)
    return curve


def test_curve_keeps_the_best_so_far_and_finds_the_epoch_it_reached_a_target() -> None:
    """A curve is the running maximum, and ``epochs_to`` is the first epoch at the target."""
    curve = _curve(0.1, 0.5, 0.3, 0.9)
    assert curve.best == [0.1, 0.5, 0.5, 0.9]
    assert curve.epochs_to(0.5) == 2
    assert curve.epochs_to(0.95) is None
    assert Curve().final == 0.0


def test_speedup_counts_a_seed_that_never_reached_the_target_as_zero() -> None:
    """Speedup is baseline's epochs to its best / the method's, 0x where it never got there."""
    baseline = [_curve(0.1, 0.2, 0.3, 0.9), _curve(0.5, 0.6), _curve(0.7, 0.8)]
    runs = [_curve(0.95), _curve(0.1, 0.2), _curve(0.1, 0.8)]
    # seed 1: 4 / 1; seed 2: never (0x); seed 3: 2 / 2
    assert speedup(runs, baseline) == 1.0
    assert median_epochs_to(runs, baseline) == (1.5, 2)


def test_speedup_uses_only_the_seeds_both_ran() -> None:
    """A peer that ran fewer seeds is compared on those seeds only."""
    runs = [_curve(0.9), _curve(0.1)]
    assert speedup(runs, [_curve(0.5, 0.9)]) == 2.0


def test_every_in_process_method_spends_exactly_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cairn's four methods and Optuna's TPE with pruning each train exactly ``budget`` epochs."""
    pytest.importorskip("torch")
    pytest.importorskip("optuna")
    monkeypatch.setattr(search, "BUDGET", 12)
    monkeypatch.setattr(search, "MAX_EPOCHS", 4)
    monkeypatch.setattr(search, "PBT_ROUND", 1)
    digits = search.load_digits_module()
    runner = search.Runner(digits, digits.load_data())
    for name, searcher in search.searchers().items():
        curve = runner.cairn(searcher, 1, 12)
        assert len(curve.best) == 12, name
        assert curve.trials >= 3, name
    curve = runner.optuna_tpe(1, 12)
    assert len(curve.best) == 12
    assert curve.trials >= 3
