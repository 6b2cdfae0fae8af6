"""Population-based training: rounds close the worst, clone the best from their checkpoints."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from events.domain.config import ConfigError, ExperimentConfig, PBTSearcher, parse_config
from events.domain.search import (
    Create,
    PBTStrategy,
    SearchMethod,
    Shutdown,
    Stop,
    make_method,
)
from events.domain.search.preview import preview_search, render_preview

HPS: dict[str, Any] = {
    "lr": {"type": "log", "minval": -4, "maxval": -1, "base": 10},
    "hidden": {"type": "int", "minval": 8, "maxval": 64},
    "opt": {"kind": {"type": "categorical", "vals": ["adam", "sgd"]}, "beta": 0.9},
}


def pbt_config(seed: int = 5, **searcher: Any) -> ExperimentConfig:
    raw = {
        "searcher": {
            "name": "pbt",
            "metric": "loss",
            "population_size": 4,
            "num_rounds": 3,
            "length_per_round": {"batches": 10},
            "replace_function": {"truncate_fraction": 0.25},
            "explore_function": {"resample_probability": 0.2, "perturb_factor": 0.2},
            **searcher,
        },
        "hyperparameters": HPS,
    }
    return parse_config(raw, default_seed=seed)


def loss(hparams: dict[str, Any], batches: int) -> float:
    """Better near lr = 1e-2 and with more training."""
    return abs(math.log10(hparams["lr"]) + 2) + 5.0 / (batches + 1) + hparams["hidden"] / 1000


class Population:
    """Simulated trials in lock-step: each trains 5 batches, validates, then checkpoints."""

    def __init__(self, method: SearchMethod, total: int = 30) -> None:
        self.method = method
        self.total = total
        self.live: dict[str, int] = {}
        self.hparams: dict[str, dict[str, Any]] = {}
        self.ops: list[Any] = []

    def take(self, ops: list[Any]) -> None:
        for op in ops:
            self.ops.append(op)
            if isinstance(op, Create):
                self.live[op.request_id] = op.warm_start_steps
                self.hparams[op.request_id] = op.hparams
                self.method.on_trial_created(op.request_id)
            elif isinstance(op, Stop) and op.request_id in self.live:
                del self.live[op.request_id]
                self.take(self.method.on_trial_closed(op.request_id))

    def step(self) -> None:
        for rid in list(self.live):
            if rid not in self.live:
                continue
            steps = self.live[rid] + 5
            self.live[rid] = steps
            self.take(self.method.on_validation(rid, loss(self.hparams[rid], steps), steps))
            if rid in self.live:
                self.take(self.method.on_checkpoint(rid, f"ckpt-{rid}-{steps}", steps))
            if rid in self.live and steps >= self.total:
                del self.live[rid]
                self.take(self.method.on_trial_closed(rid))

    def run(self) -> list[Any]:
        self.take(self.method.initial_operations())
        for _ in range(100):
            if self.method.is_shutdown:
                return self.ops
            self.step()
        raise AssertionError("search did not end")


def test_config_takes_determineds_field_names() -> None:
    """The pbt searcher parses Determined's fields; a bad truncate_fraction is a clear error."""
    searcher = pbt_config().searcher
    assert isinstance(searcher, PBTSearcher)
    assert searcher.length_per_round.units == 10
    assert searcher.replace_function.truncate_fraction == 0.25
    with pytest.raises(ConfigError, match="truncate_fraction"):
        pbt_config(replace_function={"truncate_fraction": 0.9})
    with pytest.raises(ConfigError, match="population_size"):
        pbt_config(population_size=1)


def test_each_round_stops_the_worst_and_clones_the_best_from_its_checkpoint() -> None:
    """Every round but the last stops the worst quarter and clones as many of the best, each
    clone warm-starting from its parent's checkpoint at the round's end with explored hparams."""
    ops = Population(make_method(pbt_config())).run()
    creates = [op for op in ops if isinstance(op, Create)]
    assert len(creates) == 4 + 2 * 1
    clones = [c for c in creates if c.parent is not None]
    assert [c.round for c in clones] == [1, 2]
    for clone in clones:
        assert clone.warm_start == f"ckpt-{clone.parent}-{clone.warm_start_steps}"
        assert clone.warm_start_steps == 10 * clone.round
        assert clone.change, "explore changed at least one hyperparameter"
        for name, step in clone.change.items():
            assert step["from"] != step["to"], name
        assert 1e-4 <= clone.hparams["lr"] <= 1e-1
        assert 8 <= clone.hparams["hidden"] <= 64
        assert clone.hparams["opt"]["beta"] == 0.9
    stops = [op for op in ops if isinstance(op, Stop)]
    assert len(stops) >= 2 and len(set(stops)) == len(stops), "one per round, none twice"
    assert isinstance(ops[-1], Shutdown) and not ops[-1].failure


def test_the_parent_is_the_best_of_its_round() -> None:
    """The first clone's parent had the best loss at the end of round 0."""
    method = make_method(pbt_config())
    pop = Population(method)
    ops = pop.run()
    first = next(op for op in ops if isinstance(op, Create) and op.parent is not None)
    originals = [op for op in ops if isinstance(op, Create)][:4]
    best = min(originals, key=lambda c: loss(c.hparams, 10))
    assert first.parent == best.request_id


def test_clone_waits_for_the_parents_checkpoint_past_the_round_end() -> None:
    """A clone is created only when its parent has a checkpoint at or past the round's end."""
    method = make_method(pbt_config(population_size=2, num_rounds=2))
    initial = method.initial_operations()
    a, b = (op.request_id for op in initial if isinstance(op, Create))
    method.on_checkpoint(a, "old", 5)
    assert method.on_validation(a, 0.1, 10) == []
    ops = method.on_validation(b, 0.9, 10)
    assert ops == [Stop(b)], "the worst is stopped; the clone waits for a fresh checkpoint"
    (clone,) = method.on_checkpoint(a, "fresh", 10)
    assert isinstance(clone, Create)
    assert (clone.parent, clone.round, clone.warm_start, clone.warm_start_steps) == (
        a,
        1,
        "fresh",
        10,
    )


def test_a_closed_parent_is_cloned_from_its_latest_checkpoint() -> None:
    """A parent that closes before checkpointing past the round's end is cloned from its latest one."""
    method = make_method(pbt_config(population_size=2, num_rounds=2))
    a, b = (op.request_id for op in method.initial_operations() if isinstance(op, Create))
    method.on_checkpoint(a, "old", 5)
    method.on_validation(a, 0.1, 10)
    method.on_validation(b, 0.9, 10)
    ops = method.on_trial_closed(a)
    (clone,) = [op for op in ops if isinstance(op, Create)]
    assert (clone.warm_start, clone.warm_start_steps) == ("old", 5)


def test_restored_snapshot_continues_exactly() -> None:
    """A method restored from a mid-search snapshot makes the same decisions as the original."""
    straight = Population(make_method(pbt_config(seed=9))).run()

    method = make_method(pbt_config(seed=9))
    pop = Population(method)
    pop.take(method.initial_operations())
    for _ in range(3):
        pop.step()
    snapshot = json.loads(json.dumps(method.snapshot()))
    restored = make_method(pbt_config(seed=9))
    restored.restore(snapshot)
    assert isinstance(restored.strategy, PBTStrategy)
    pop.method = restored
    for _ in range(100):
        if restored.is_shutdown:
            break
        pop.step()
    assert pop.ops == straight


def test_larger_is_better_keeps_the_highest() -> None:
    """With smaller_is_better false the trial with the highest metric is cloned."""
    method = make_method(pbt_config(population_size=2, num_rounds=2, smaller_is_better=False))
    a, b = (op.request_id for op in method.initial_operations() if isinstance(op, Create))
    method.on_checkpoint(b, "b10", 10)
    method.on_validation(a, 0.1, 10)
    ops = method.on_validation(b, 0.9, 10)
    assert Stop(a) in ops
    (clone,) = [op for op in ops if isinstance(op, Create)]
    assert clone.parent == b


def test_a_parent_that_trained_on_is_cloned_from_its_round_end_checkpoint() -> None:
    """A parent already past the round's end when the round is decided is cloned from its first
    checkpoint at the round's end, not from its latest one."""
    method = make_method(pbt_config(population_size=2, num_rounds=3))
    a, b = (op.request_id for op in method.initial_operations() if isinstance(op, Create))
    method.on_validation(a, 0.1, 10)
    method.on_checkpoint(a, "a10", 10)
    method.on_validation(a, 0.05, 20)
    method.on_checkpoint(a, "a20", 20)
    ops = method.on_validation(b, 0.9, 10)
    (clone,) = [op for op in ops if isinstance(op, Create)]
    assert (clone.parent, clone.warm_start, clone.warm_start_steps) == (a, "a10", 10)


def test_preview_shows_pbt_rounds() -> None:
    """preview-search lists every PBT round: its end, trials ranked, stopped and cloned."""
    result = preview_search(pbt_config(population_size=8, num_rounds=4))
    assert [(r.round, r.units, r.trials, r.stopped, r.cloned) for r in result.rounds] == [
        (0, 10, 8, 2, 2),
        (1, 20, 8, 2, 2),
        (2, 30, 8, 2, 2),
        (3, 40, 8, 0, 0),
    ]
    assert result.total_trials == 8 + 3 * 2
    assert result.total_units == 8 * 40, "clones continue their parents' training"
    assert "PBT rounds" in render_preview(result)


def test_preview_shows_tpes_startup_phase() -> None:
    """preview-search says how many TPE trials are random startup trials."""
    raw = {
        "searcher": {"name": "tpe", "metric": "loss", "max_trials": 12, "n_startup_trials": 4},
        "hyperparameters": HPS,
    }
    result = preview_search(parse_config(raw, default_seed=3))
    assert result.startup_trials == 4
    assert "first 4 trial(s) are sampled at random" in render_preview(result)


def test_describe_prints_lineage(capsys: pytest.CaptureFixture[str]) -> None:
    """cairn experiment describe's lineage table names parent, round, warm start and change."""
    from cairn.cli.experiment import lineage_rows

    lineage_rows(
        [
            {
                "trial_id": 19,
                "parent_trial_id": 15,
                "round": 1,
                "change": {"lr": {"from": 0.01, "to": 0.012}},
                "warm_start_checkpoint": "6b1c1d5e-9a1e",
                "warm_start_steps": 200,
            }
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["trial", "parent", "round", "warm", "start", "change"]
    assert out[1].split() == ["19", "15", "1", "6b1c1d5e", "@200", "lr", "0.01->0.012"]
