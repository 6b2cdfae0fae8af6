"""Hostile configs: the YAML loader's limits, unstorable values and the bounds of numeric fields."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from events.domain.config import ConfigError, ConfigTooLargeError, load_yaml, parse_config
from events.domain.config.limits import (
    MAX_CONFIG_CHARS,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_NODES,
    MAX_COUNT,
    MAX_SLOTS_PER_TRIAL,
    MAX_TRIALS,
)
from events.domain.search.preview import PreviewTooLargeError, preview_search
from events.log.storable import find_unstorable

ROOT = Path(__file__).resolve().parents[2]

# Nine aliases per level, seven levels: 9**7 (4.8 million) strings from under 600 bytes.
BILLION_LAUGHS = "searcher: {name: single, metric: loss}\ndata:\n" + "\n".join(
    [f"  l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 7)]
)

RANDOM = "searcher: {name: random, metric: loss, max_trials: 4, max_length: {batches: 10}}\n"


def config_error(raw: Any, overrides: list[str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, overrides or [], default_seed=1)
    return info.value


# -- the YAML loader ---------------------------------------------------------------------------


def test_billion_laughs_is_refused_at_the_alias_that_crosses_the_limit() -> None:
    """An alias bomb is refused (400-class, not a size error) naming the alias, line and column."""
    assert len(BILLION_LAUGHS) < 600
    error = config_error(BILLION_LAUGHS)
    assert not isinstance(error, ConfigTooLargeError)
    [(path, message)] = error.errors
    assert path == "<config>"
    assert f"makes the document expand to more than {MAX_CONFIG_NODES} values" in message
    assert message.startswith("line ") and "alias *l" in message


def test_aliases_within_the_limit_still_expand() -> None:
    """Anchors, aliases and merge keys a real config uses are read as before."""
    text = (
        "base: &base {lr: 0.1, layers: [1, 2, 3]}\n"
        "hyperparameters: {a: *base, b: {<<: *base, lr: 0.2}}\n"
    )
    doc = load_yaml(text)
    assert doc["hyperparameters"]["a"] == {"lr": 0.1, "layers": [1, 2, 3]}
    assert doc["hyperparameters"]["b"] == {"lr": 0.2, "layers": [1, 2, 3]}


def test_a_collection_that_contains_its_own_alias_is_refused() -> None:
    """A recursive alias (``&a [*a]``) is refused instead of building an infinite document."""
    [(path, message)] = config_error(RANDOM + "data: &a {self: [*a]}\n").errors
    assert path == "<config>" and "alias *a refers to a collection that contains it" in message


def test_nesting_past_the_limit_is_refused_without_recursing() -> None:
    """100,000 nested flow lists are refused at the level past the limit, no RecursionError."""
    [(_, message)] = config_error("[" * 100_000).errors
    assert f"nested more than {MAX_CONFIG_DEPTH} levels deep" in message
    assert f"column {MAX_CONFIG_DEPTH + 1}:" in message


def test_nesting_through_aliases_counts_the_expanded_depth() -> None:
    """Aliases that each nest within the limit but together nest past it are refused."""
    half = MAX_CONFIG_DEPTH // 2 + 1
    text = f"a: &a {'[' * half}1{']' * half}\nb: {'[' * half}*a{']' * half}\n"
    [(_, message)] = config_error(text).errors
    assert f"nested more than {MAX_CONFIG_DEPTH} levels deep (through alias *a)" in message


def test_too_many_plain_values_and_too_long_text_are_size_errors() -> None:
    """Past the value count or the text length is a size error (the API's 413)."""
    many = RANDOM + "data: {k: [" + ",".join(["1"] * MAX_CONFIG_NODES) + "]}\n"
    [(_, message)] = config_error(many).errors
    assert isinstance(config_error(many), ConfigTooLargeError)
    assert f"more than {MAX_CONFIG_NODES} values" in message
    long = RANDOM + "description: " + "x" * MAX_CONFIG_CHARS + "\n"
    assert isinstance(config_error(long), ConfigTooLargeError)
    as_data = {"searcher": {"name": "single", "metric": "m"}, "data": {"k": [1] * MAX_CONFIG_NODES}}
    assert isinstance(config_error(as_data), ConfigTooLargeError)
    as_text = {"searcher": {"name": "single", "metric": "m"}, "name": "x" * (MAX_CONFIG_CHARS + 1)}
    assert isinstance(config_error(as_text), ConfigTooLargeError)


def test_overlong_integers_are_refused_unparsed() -> None:
    """A 5,000-digit integer is refused at its line and column, not handed to int()."""
    [(path, message)] = config_error(f"max_restarts: {'7' * 5000}\n" + RANDOM).errors
    assert path == "<config>"
    assert message.startswith("line 1, column 15: integer longer than")


def test_an_override_goes_through_the_same_loader() -> None:
    """A ``--config key=value`` override is read by the bounded loader too."""
    error = config_error(RANDOM, ["data.x=" + "[" * 1000])
    assert error.paths() == ["<override data.x>"]
    assert "nested more than" in str(error)


# -- values the event log cannot store ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "problem"),
    [
        ('name: "bad \\ud800 name"\n', "name", "lone surrogate (U+D800)"),
        ('labels: [ok, "nul \\0 here"]\n', "labels[1]", "NUL characters"),
        ('data: {"k\\udfff": 1}\n', "data", "key 'k\\udfff': text may not contain a lone"),
        ("hyperparameters: {lr: .nan}\n", "hyperparameters.lr", "finite number, got nan"),
        ("resources: {weight: .inf}\n", "resources.weight", "finite number, got inf"),
    ],
)
def test_unstorable_values_are_refused_at_their_path(text: str, path: str, problem: str) -> None:
    """Lone surrogates, NUL characters and non-finite numbers are refused where they are."""
    [(where, message)] = config_error(RANDOM + text).errors
    assert where == path
    assert problem in message


def test_find_unstorable_walks_deep_documents_iteratively() -> None:
    """A 100,000-deep document is measured without recursion and reported at the limit."""
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    found = find_unstorable(deep, max_depth=100)
    assert found is not None
    path, message = found
    assert path == [0] * 100 and message == "nested more than 100 levels deep"
    assert find_unstorable({"a": [1, "ok", {"b": 2.5}]}, max_depth=3, finite=True) is None


# -- numeric bounds ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (f"searcher.max_trials={2**70}", f"searcher.max_trials: must be <= {MAX_TRIALS}, got {2**70}"),
        ("searcher.max_concurrent_trials=100001", "searcher.max_concurrent_trials: must be <= 100000"),
        ("searcher.max_length.batches=9007199254740992", f"searcher.max_length.batches: must be <= {MAX_COUNT}"),
        ("resources.slots_per_trial=4097", f"resources.slots_per_trial: must be <= {MAX_SLOTS_PER_TRIAL}"),
        ("resources.max_slots=1000001", "resources.max_slots: must be <= 1000000"),
        ("resources.weight=1e9", "resources.weight: must be <= 1000000.0"),
        ("max_restarts=10001", "max_restarts: must be <= 10000"),
        ("records_per_epoch=9007199254740992", "records_per_epoch: must be <= 9007199254740991"),
        ("min_validation_period={epochs: 9007199254740992}", "min_validation_period.epochs: must be <="),
        ("environment.ports={web: 70000}", "environment.ports.web: must be <= 65535"),
        ("hyperparameters={n: {type: int, minval: 0, maxval: 9223372036854775808}}", "hyperparameters.n.maxval: must be <= 9223372036854775807"),
        ("hyperparameters={x: {type: double, minval: -1e308, maxval: 1e308}}", "hyperparameters.x.minval: must be >= -1e+300"),
        ("hyperparameters={x: {type: log, minval: 0, maxval: 400}}", "hyperparameters.x.maxval: base ** maxval (10.0 ** 400.0) is too large"),
        ("hyperparameters={x: {type: int, minval: 0, maxval: 9, count: 100001}}", "hyperparameters.x.count: must be <= 100000"),
    ],
)  # fmt: skip
def test_numbers_past_their_bound_are_refused_with_the_path(override: str, line: str) -> None:
    """Each bounded field refuses a value past its bound, naming the path, bound and value."""
    lines = str(config_error(RANDOM, [override])).splitlines()
    assert any(text.startswith(line) for text in lines), lines


@pytest.mark.parametrize(
    ("searcher", "line"),
    [
        ("{name: async_halving, metric: m, max_trials: 4, max_time: 9, time_metric: b, num_rungs: 101}", "searcher.num_rungs: must be <= 100"),
        ("{name: adaptive_asha, metric: m, max_trials: 4, max_time: 9, time_metric: b, max_rungs: 101}", "searcher.max_rungs: must be <= 100"),
        ("{name: adaptive_asha, metric: m, max_trials: 4, max_time: 9, time_metric: b, divisor: 1001}", "searcher.divisor: must be <= 1000.0"),
        ("{name: adaptive_asha, metric: m, max_trials: 4, max_time: 9, time_metric: b, bracket_rungs: [1000]}", "searcher.bracket_rungs[0]: must be <= 100"),
        ("{name: random, metric: m, max_trials: 4, source_trial_id: 9223372036854775808}", "searcher.source_trial_id: must be <= 9223372036854775807"),
    ],
)  # fmt: skip
def test_searcher_bounds_keep_rung_arithmetic_finite(searcher: str, line: str) -> None:
    """Rung counts, divisors and ids past their bounds are refused at their path."""
    lines = str(config_error(f"searcher: {searcher}\n")).splitlines()
    assert any(text.startswith(line) for text in lines), lines


def test_largest_allowed_values_are_accepted_and_keep_rungs_finite() -> None:
    """Every bound itself is accepted, and the rung arithmetic at the extremes stays finite."""
    config = parse_config(
        "searcher: {name: async_halving, metric: m, max_trials: 100000, max_time: 10,"
        " time_metric: b, num_rungs: 100, divisor: 1000}\n"
        "resources: {slots_per_trial: 4096, max_slots: 1000000, weight: 1000000}\n"
        "max_restarts: 10000\n",
        default_seed=1,
    )
    assert config.resources.slots_per_trial == MAX_SLOTS_PER_TRIAL
    assert math.isfinite(config.searcher.divisor ** (100 - 1))  # type: ignore[union-attr]


def test_an_astronomical_grid_is_refused_before_it_is_enumerated() -> None:
    """A grid of 1000**40 points is refused at ``hyperparameters`` (enumerating it never ends)."""
    axes = ", ".join(f"h{i}: {{type: int, minval: 0, maxval: 999, count: 1000}}" for i in range(40))
    text = f"searcher: {{name: grid, metric: m}}\nhyperparameters: {{{axes}}}\n"
    error = config_error(text)
    assert error.errors == [
        (
            "hyperparameters",
            f"the grid has more than {MAX_TRIALS} points (the product of every axis's size)",
        )
    ]


def test_a_grid_at_the_limit_is_accepted() -> None:
    """A grid of exactly MAX_TRIALS points is a valid config."""
    text = (
        "searcher: {name: grid, metric: m}\n"
        "hyperparameters: {a: {type: int, minval: 1, maxval: 1000, count: 1000},"
        " b: {type: categorical, vals: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]},"
        " c: {type: double, minval: 0, maxval: 1, count: 10}}\n"
    )
    parse_config(text, default_seed=1)


# -- preview-search ----------------------------------------------------------------------------

HUGE_ASHA = (
    "searcher: {name: async_halving, metric: m, max_trials: 100000, time_metric: batches,"
    " max_time: 100000, num_rungs: 100, divisor: 1.01}\n"
)


def test_preview_refuses_a_search_too_large_to_simulate_before_running_it() -> None:
    """100,000 trials x 100 rungs is refused up front with what to change."""
    config = parse_config(HUGE_ASHA, default_seed=0)
    with pytest.raises(PreviewTooLargeError, match="up to 10000000 validations"):
        preview_search(config)


def test_preview_cli_reports_a_too_large_search_as_an_error(tmp_path: Path) -> None:
    """`cairn preview-search` prints the refusal on stderr and exits 1, no traceback."""
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE_ASHA)
    done = subprocess.run(
        [sys.executable, "-m", "cairn", "preview-search", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: cannot preview {path}: the search may need up to")
    assert "Traceback" not in done.stderr


def test_preview_cli_refuses_an_alias_bomb(tmp_path: Path) -> None:
    """`cairn preview-search` reads configs with the bounded loader: a bomb is a config error."""
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS)
    done = subprocess.run(
        [sys.executable, "-m", "cairn", "preview-search", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "makes the document expand to more than" in done.stderr
