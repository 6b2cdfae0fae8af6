"""Experiment config: parsing, defaults, round-trips, overrides and path-precise errors."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from events.domain.config import (
    AdaptiveASHASearcher,
    ConfigError,
    ConstHP,
    DoubleHP,
    IntHP,
    LogHP,
    SharedFSStorage,
    dump_yaml,
    load_yaml,
    parse_config,
)

# Determined's examples/tutorials/mnist_pytorch/adaptive.yaml, as described in the reference §1.7.
DETERMINED_ADAPTIVE = """
name: mnist_pytorch_adaptive_search
hyperparameters:
  learning_rate:
    type: double
    minval: .0001
    maxval: 1.0
  n_filters1:
    type: int
    minval: 8
    maxval: 64
  n_filters2:
    type: int
    minval: 8
    maxval: 72
  dropout1:
    type: double
    minval: .2
    maxval: .8
  dropout2:
    type: double
    minval: .2
    maxval: .8
searcher:
  name: adaptive_asha
  metric: validation_loss
  smaller_is_better: true
  max_trials: 16
  time_metric: batches
  max_time: 937 # 60,000 training images with batch size 64
entrypoint: python3 train.py --epochs 1
"""

CORE_API_HPSEARCH = """
name: core-api-stage-3
entrypoint: python3 3_hpsearch.py
hyperparameters:
  increment_by:
    type: int
    minval: 1
    maxval: 8
searcher:
  name: adaptive_asha
  metric: x
  max_trials: 10
  time_metric: batches
  max_time: 100
max_restarts: 0
"""

MINIMAL = {"searcher": {"name": "single", "metric": "loss"}}


def errors_of(raw: Any, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, overrides or [], default_seed=1)
    return str(info.value)


# -- accepted configs and defaults -------------------------------------------------------------


def test_determined_adaptive_example_is_accepted_as_is() -> None:
    """Determined's MNIST adaptive.yaml parses unchanged into the expected typed fields."""
    config = parse_config(DETERMINED_ADAPTIVE, default_seed=7)
    searcher = config.searcher
    assert isinstance(searcher, AdaptiveASHASearcher)
    assert (searcher.max_trials, searcher.time_metric, searcher.max_time) == (16, "batches", 937)
    assert searcher.length() == ("batches", 937)
    assert config.hyperparameters["learning_rate"] == DoubleHP(
        type="double", minval=0.0001, maxval=1.0
    )
    assert config.hyperparameters["n_filters2"] == IntHP(type="int", minval=8, maxval=72)
    assert config.entrypoint == "python3 train.py --epochs 1"


def test_core_api_example_and_its_legacy_max_length_form_are_accepted() -> None:
    """The Core API toy search parses in its 0.38 form and its pre-0.38 max_length form."""
    current = parse_config(CORE_API_HPSEARCH, default_seed=1)
    legacy_text = CORE_API_HPSEARCH.replace(
        "  time_metric: batches\n  max_time: 100\n", "  max_length: 100\n"
    )
    legacy = parse_config(legacy_text, default_seed=1)
    assert isinstance(current.searcher, AdaptiveASHASearcher)
    assert isinstance(legacy.searcher, AdaptiveASHASearcher)
    assert current.searcher.length() == legacy.searcher.length() == ("batches", 100)
    assert current.max_restarts == 0


def test_defaults_are_filled_as_determined_does() -> None:
    """Omitted fields take Determined's defaults throughout the config."""
    config = parse_config(
        {
            "searcher": {"name": "adaptive_asha", "metric": "m", "max_trials": 4},
            "checkpoint_storage": {"type": "shared_fs", "host_path": "/mnt/ckpt"},
        },
        ["searcher.max_length=10"],
        default_seed=3,
    )
    searcher = config.searcher
    assert isinstance(searcher, AdaptiveASHASearcher)
    assert searcher.smaller_is_better is True
    assert (searcher.max_concurrent_trials, searcher.divisor, searcher.max_rungs) == (16, 4.0, 5)
    assert searcher.mode == "standard" and searcher.bracket_rungs == []
    assert config.max_restarts == 5 and config.checkpoint_policy == "best"
    assert (config.resources.slots_per_trial, config.resources.weight) == (1, 1.0)
    assert config.resources.priority is None and config.resources.max_slots is None
    storage = config.checkpoint_storage
    assert isinstance(storage, SharedFSStorage)
    assert (storage.save_experiment_best, storage.save_trial_best, storage.save_trial_latest) == (
        0,
        1,
        1,
    )
    assert config.scheduling_unit == 100 and config.records_per_epoch == 0
    assert config.min_validation_period.batches == 0
    assert config.perform_initial_validation is False and config.debug is False


def test_seed_comes_from_default_seed_then_clock_and_an_explicit_seed_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A missing experiment_seed is filled from default_seed, else the unix time."""
    assert parse_config(MINIMAL, default_seed=42).experiment_seed == 42
    monkeypatch.setattr("events.domain.config.loading.time.time", lambda: 1_700_000_123.9)
    assert parse_config(MINIMAL).experiment_seed == 1_700_000_123
    explicit = {**MINIMAL, "reproducibility": {"experiment_seed": 9}}
    assert parse_config(explicit, default_seed=42).experiment_seed == 9


def test_shorthand_values_are_constants_and_plain_mappings_are_groups() -> None:
    """Scalars and lists become const; a mapping without type becomes a nested group."""
    config = parse_config(
        {**MINIMAL, "hyperparameters": {"bs": 64, "sizes": [1, 2], "opt": {"name": "adam"}}},
        default_seed=1,
    )
    hps = config.hyperparameters
    assert hps["bs"] == ConstHP(type="const", val=64)
    assert hps["sizes"] == ConstHP(type="const", val=[1, 2])
    assert hps["opt"] == {"name": ConstHP(type="const", val="adam")}


def test_exponent_floats_without_a_dot_are_numbers() -> None:
    """``1e-4`` reads as a float (YAML 1.2), not as the string PyYAML would make it."""
    config = parse_config(
        "searcher: {name: single, metric: m}\n"
        "hyperparameters: {lr: {type: log, minval: -5, maxval: 1e-1}}\n",
        default_seed=1,
    )
    assert config.hyperparameters["lr"] == LogHP(type="log", minval=-5.0, maxval=0.1)


def test_yaml_dump_quotes_strings_that_would_read_as_numbers() -> None:
    """dump_yaml output reads back identically, even for strings like '1e5'."""
    data = {"a": "1e5", "b": 1e-5, "c": "yes", "d": [1, "2"]}
    assert load_yaml(dump_yaml(data)) == data


def test_models_are_frozen() -> None:
    """A parsed config cannot be changed in place."""
    config = parse_config(MINIMAL, default_seed=1)
    with pytest.raises(ValidationError):
        config.max_restarts = 3  # type: ignore[misc]


# -- round-trips (property based) --------------------------------------------------------------

names = st.text(string.ascii_lowercase + "_", min_size=1, max_size=8).filter(lambda s: s != "type")
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    # NUL and lone surrogates cannot be stored and are refused (tests/unit/test_config_limits.py).
    st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=6),
)
consts = st.one_of(
    json_scalars,
    st.lists(json_scalars, max_size=3),
    st.builds(lambda v: {"type": "const", "val": v}, json_scalars),
)


@st.composite
def numeric_hps(draw: st.DrawFn, need_count: bool) -> dict[str, Any]:
    kind = draw(st.sampled_from(["int", "double", "log"]))
    lo: float
    hi: float
    if kind == "int":
        lo, hi = sorted(draw(st.lists(st.integers(-100, 100), min_size=2, max_size=2, unique=True)))
    else:
        bound = st.floats(-50, 50, allow_nan=False)
        lo, hi = sorted(draw(st.lists(bound, min_size=2, max_size=2, unique=True)))
    hp: dict[str, Any] = {"type": kind, "minval": lo, "maxval": hi}
    if kind == "log":
        hp["base"] = draw(st.sampled_from([2.0, 10.0, 2.718281828]))
    if need_count or draw(st.booleans()):
        hp["count"] = draw(st.integers(1, 4))
    return hp


def hyperparameters(need_count: bool) -> st.SearchStrategy[dict[str, Any]]:
    leaves = st.one_of(
        consts,
        numeric_hps(need_count),
        st.builds(
            lambda vals: {"type": "categorical", "vals": vals},
            st.lists(json_scalars, min_size=1, max_size=4),
        ),
    )
    tree = st.recursive(leaves, lambda kids: st.dictionaries(names, kids, max_size=3), max_leaves=6)
    return st.dictionaries(names, tree, max_size=4)


@st.composite
def searchers(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(["single", "random", "grid", "async_halving", "adaptive_asha"]))
    out: dict[str, Any] = {"name": name, "metric": draw(names)}
    if draw(st.booleans()):
        out["smaller_is_better"] = draw(st.booleans())
    if name in ("random", "async_halving", "adaptive_asha"):
        out["max_trials"] = draw(st.integers(1, 64))
    if name != "single" and draw(st.booleans()):
        out["max_concurrent_trials"] = draw(st.integers(0, 16))
    if name in ("async_halving", "adaptive_asha"):
        out["divisor"] = draw(st.sampled_from([2, 3, 4.0, 2.5]))
        if draw(st.booleans()):
            out["time_metric"], out["max_time"] = draw(names), draw(st.integers(1, 5000))
        else:
            out["max_length"] = draw(
                st.one_of(
                    st.integers(1, 5000),
                    st.builds(lambda n: {"epochs": n}, st.integers(1, 50)),
                )
            )
    if name == "async_halving":
        out["num_rungs"] = draw(st.integers(1, 5))
    if name == "adaptive_asha":
        out["mode"] = draw(st.sampled_from(["aggressive", "standard", "conservative"]))
    return out


@st.composite
def raw_configs(draw: st.DrawFn) -> dict[str, Any]:
    searcher = draw(searchers())
    raw: dict[str, Any] = {
        "searcher": searcher,
        "hyperparameters": draw(hyperparameters(need_count=searcher["name"] == "grid")),
        "reproducibility": {"experiment_seed": draw(st.integers(0, 2**32 - 1))},
    }
    if draw(st.booleans()):
        raw["entrypoint"] = draw(st.one_of(names, st.lists(names, min_size=1, max_size=3)))
    if draw(st.booleans()):
        slots = draw(st.integers(0, 8))
        raw["resources"] = {
            "slots_per_trial": slots,
            "max_slots": draw(st.integers(slots, 64)),
            "priority": draw(st.integers(1, 99)),
            "shm_size": draw(st.sampled_from([1024, "4G", "512Mi"])),
        }
    if draw(st.booleans()):
        raw["checkpoint_storage"] = draw(
            st.sampled_from(
                [
                    {"type": "shared_fs", "host_path": "/mnt", "storage_path": "ckpt"},
                    {"type": "directory", "container_path": "/ckpt", "save_trial_best": 3},
                ]
            )
        )
    if draw(st.booleans()):
        raw["environment"] = {
            "image": draw(st.sampled_from(["img:1", {"cpu": "c:1", "cuda": "g:1"}])),
            "environment_variables": draw(
                st.sampled_from([["A=1", "B="], {"cpu": ["X=1"], "cuda": []}])
            ),
        }
    if draw(st.booleans()):
        raw["labels"] = draw(st.lists(names, max_size=3))
        raw["data"] = {"k": draw(st.lists(json_scalars, max_size=3))}
    return raw


ROUND_TRIP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@ROUND_TRIP
@given(raw_configs())
def test_to_dict_round_trips_through_parse_config(raw: dict[str, Any]) -> None:
    """parse_config(c.to_dict()) == c for any valid config, also through JSON and YAML text."""
    config = parse_config(raw)
    data = config.to_dict()
    assert parse_config(data) == config
    assert parse_config(json.loads(json.dumps(data))) == config
    assert parse_config(dump_yaml(data)) == config
    assert parse_config(data).to_dict() == data


@ROUND_TRIP
@given(raw_configs())
def test_parse_config_does_not_modify_its_input(raw: dict[str, Any]) -> None:
    """The caller's dict is left untouched (overrides and shorthand apply to a copy)."""
    before = json.dumps(raw, sort_keys=True)
    parse_config(raw, ["max_restarts=2"])
    assert json.dumps(raw, sort_keys=True) == before


# -- errors ------------------------------------------------------------------------------------


def test_error_examples_from_the_spec() -> None:
    """Errors read ``path: expected, got value`` for bounds, unknown keys and ranges."""
    text = errors_of(
        {
            "searcher": {"name": "random", "metric": "m", "max_trials": 0, "nme": 1},
            "hyperparameters": {"lr": {"type": "double", "minval": 1.0, "maxval": 0.1}},
        }
    )
    lines = text.splitlines()
    assert "searcher.max_trials: must be >= 1, got 0" in lines
    assert any(line.startswith("searcher.nme: unknown field") for line in lines)
    assert "hyperparameters.lr.minval: must be < maxval (1.0 >= 0.1)" in lines


BOUNDED_FIELDS = [
    ("searcher.max_trials", st.integers(max_value=0), ">= 1"),
    ("max_restarts", st.integers(max_value=-1), ">= 0"),
    ("resources.slots_per_trial", st.integers(max_value=-1), ">= 0"),
    ("resources.priority", st.integers(min_value=100), "<= 99"),
    ("resources.priority", st.integers(max_value=0), ">= 1"),
    ("reproducibility.experiment_seed", st.integers(min_value=2**32), "<= 4294967295"),
    ("searcher.max_concurrent_trials", st.integers(max_value=-1), ">= 0"),
    ("scheduling_unit", st.integers(max_value=0), ">= 1"),
]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(BOUNDED_FIELDS).flatmap(lambda f: st.tuples(st.just(f), f[1])))
def test_out_of_range_values_name_path_value_and_bound(case: Any) -> None:
    """Any out-of-range number is reported at its dotted path with the bound and the value."""
    (path, _, bound), value = case
    raw = {"searcher": {"name": "random", "metric": "m", "max_trials": 3}}
    text = errors_of(raw, [f"{path}={value}"])
    assert f"{path}: must be {bound}, got {value}" in text.splitlines()


SECTIONS = ["", "searcher.", "resources.", "environment.", "reproducibility.", "profiling."]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SECTIONS), st.text(string.ascii_lowercase, min_size=3, max_size=10))
def test_unknown_keys_are_rejected_at_their_path(section: str, key: str) -> None:
    """A key no model defines is rejected, named by its full dotted path."""
    key = "zz" + key  # no config field starts with "zz"
    raw = {"searcher": {"name": "single", "metric": "m"}}
    text = errors_of(raw, [f"{section}{key}=1"])
    assert text.splitlines()[0].startswith(f"{section}{key}: unknown field")


@settings(max_examples=30, deadline=None)
@given(st.floats(-100, 100, allow_nan=False), st.floats(0, 100, allow_nan=False))
def test_any_empty_double_range_is_rejected_with_both_ends(lo: float, gap: float) -> None:
    """minval >= maxval is reported at hyperparameters.<name>.minval with both values."""
    hi = lo - gap
    raw = {
        "searcher": {"name": "single", "metric": "m"},
        "hyperparameters": {"grp": {"p": {"type": "double", "minval": lo, "maxval": hi}}},
    }
    text = errors_of(raw)
    assert f"hyperparameters.grp.p.minval: must be < maxval ({lo} >= {hi})" in text


def test_asha_needs_time_metric_and_max_time_or_max_length() -> None:
    """ASHA searchers without a time axis are rejected at the missing field."""
    base = {"name": "async_halving", "metric": "m", "max_trials": 4, "num_rungs": 2}
    assert errors_of({"searcher": base}).startswith("searcher.time_metric: async_halving needs")
    missing_max = errors_of({"searcher": {**base, "time_metric": "batches"}})
    assert missing_max == "searcher.max_time: required when time_metric is set"
    missing_metric = errors_of({"searcher": {**base, "max_time": 10}})
    assert missing_metric == "searcher.time_metric: required when max_time is set"
    assert parse_config({"searcher": {**base, "max_length": {"epochs": 2}}}, default_seed=1)


def test_grid_requires_count_on_every_numeric_hyperparameter() -> None:
    """Grid search lists each int/double/log hyperparameter lacking count, nested ones too."""
    raw = {
        "searcher": {"name": "grid", "metric": "m"},
        "hyperparameters": {
            "a": {"type": "int", "minval": 1, "maxval": 4},
            "b": {"type": "categorical", "vals": [1, 2]},
            "g": {"c": {"type": "log", "minval": -3, "maxval": -1}, "d": 3},
            "e": {"type": "double", "minval": 0, "maxval": 1, "count": 2},
        },
    }
    lines = errors_of(raw).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "hyperparameters.a.count",
        "hyperparameters.g.c.count",
    ]
    assert all("required for grid search" in line for line in lines)


def test_max_slots_below_slots_per_trial_is_rejected() -> None:
    """max_slots must leave room for at least one trial."""
    text = errors_of({**MINIMAL, "resources": {"slots_per_trial": 4, "max_slots": 2}})
    assert text == "resources.max_slots: must be >= slots_per_trial (4), got 2"


def test_type_errors_name_what_was_expected() -> None:
    """Wrong shapes and wrong types say what was expected and what was found."""
    text = errors_of(
        {
            **MINIMAL,
            "entrypoint": 5,
            "labels": "x",
            "max_restarts": 1.5,
            "debug": "yes",
            "environment": {"environment_variables": ["NOEQUALS"]},
        }
    )
    lines = text.splitlines()
    assert "entrypoint: must be a string or a non-empty list of strings, got 5" in lines
    assert "labels: must be a list, got 'x'" in lines
    assert "max_restarts: must be an integer, got 1.5" in lines
    assert "debug: must be a boolean (true/false), got 'yes'" in lines
    assert "environment.environment_variables[0]: must look like KEY=VALUE, got 'NOEQUALS'" in lines


def test_unknown_discriminators_list_the_valid_choices() -> None:
    """A bad searcher name, hyperparameter type or storage type lists the valid ones."""
    text = errors_of(
        {
            "searcher": {"name": "bayes", "metric": "m"},
            "hyperparameters": {"lr": {"type": "float", "minval": 0, "maxval": 1}},
            "checkpoint_storage": {"type": "s4"},
        }
    )
    lines = text.splitlines()
    (name_line,) = [line for line in lines if line.startswith("searcher.name:")]
    assert name_line.startswith("searcher.name: must be one of 'single', 'random'")
    assert name_line.endswith("got 'bayes'")
    assert "hyperparameters.lr.type: must be one of" in text and "got 'float'" in text
    assert "'group'" not in text
    assert any(line.startswith("checkpoint_storage.type: must be one of") for line in lines)


def test_shared_fs_storage_path_must_stay_under_host_path() -> None:
    """An absolute storage_path outside host_path is rejected at storage_path."""
    storage = {"type": "shared_fs", "host_path": "/mnt/a", "storage_path": "/mnt/b"}
    text = errors_of({**MINIMAL, "checkpoint_storage": storage})
    assert text.startswith("checkpoint_storage.storage_path: must be relative or under host_path")
    ok = {**storage, "storage_path": "/mnt/a/ckpts"}
    assert parse_config({**MINIMAL, "checkpoint_storage": ok}, default_seed=1)


def test_bad_yaml_reports_the_line() -> None:
    """Malformed YAML is a ConfigError that gives line and column."""
    text = errors_of("searcher:\n  name: single\n  metric: [unclosed\n")
    assert text.startswith("<config>: invalid YAML: line ")
    assert errors_of("- a list") == '<config>: must be a mapping, got ["a list"]'


# -- overrides ---------------------------------------------------------------------------------


def test_overrides_set_typed_values_before_validation() -> None:
    """key.path=value overrides parse the value as YAML, create sections and fix errors."""
    raw = {"searcher": {"name": "random", "metric": "m", "max_trials": 0}}
    config = parse_config(
        raw,
        [
            "searcher.max_trials=8",
            "resources.slots_per_trial=2",
            "labels=[a, b]",
            "hyperparameters.lr={type: log, minval: -4, maxval: -1}",
            "description=null",
            "debug=true",
        ],
        default_seed=1,
    )
    assert config.searcher.max_trials == 8  # type: ignore[union-attr]
    assert config.resources.slots_per_trial == 2
    assert config.labels == ["a", "b"] and config.debug is True
    assert isinstance(config.hyperparameters["lr"], LogHP)


def test_overrides_index_lists_and_later_overrides_win() -> None:
    """A numeric path part indexes a list; the last override of a key is the one kept."""
    raw = {**MINIMAL, "bind_mounts": [{"host_path": "/a", "container_path": "/b"}]}
    config = parse_config(
        raw,
        ["bind_mounts.0.read_only=true", "max_restarts=1", "max_restarts=2"],
        default_seed=1,
    )
    assert config.bind_mounts[0].read_only is True
    assert config.max_restarts == 2


def test_malformed_overrides_are_config_errors() -> None:
    """Overrides without '=' or through a scalar are rejected with the override named."""
    assert errors_of(MINIMAL, ["max_restarts"]).startswith("<override>: must look like")
    text = errors_of({**MINIMAL, "hyperparameters": {"lr": 0.1}}, ["hyperparameters.lr.x=1"])
    assert text.startswith("hyperparameters.lr: is 0.1, not a mapping")
