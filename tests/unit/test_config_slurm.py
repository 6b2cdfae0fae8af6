"""The experiment's ``slurm`` section: honoured (no warning) except ``gpu_type``, and every
``sbatch_args`` entry checked at validation, refused at its own path."""

from __future__ import annotations

import pytest

from events.domain.config import ConfigError, parse_config
from events.domain.config.resource_pools import SBATCH_ARGS_CAIRN_SETS

SEARCHER = {"name": "single", "metric": "loss"}


def _config(slurm: dict[str, object]) -> dict[str, object]:
    return {"searcher": SEARCHER, "slurm": slurm}


def test_slots_per_node_and_sbatch_args_are_accepted_without_warning() -> None:
    """Options cairn does not set pass, and are kept as written."""
    args = ["--exclusive", "--constraint=a100", "--mem=0", "-C", "--mail-type=END"]
    config = parse_config(_config({"slots_per_node": 4, "sbatch_args": args}))
    assert config.warnings == ()
    assert config.slurm is not None and config.slurm.sbatch_args == args
    assert config.slurm.slots_per_node == 4


def test_gpu_type_is_accepted_with_a_warning_of_its_own() -> None:
    """``gpu_type`` is the one field of the section reported as ignored."""
    config = parse_config(_config({"gpu_type": "a100", "sbatch_args": ["--exclusive"]}))
    [warning] = config.warnings
    assert warning.path == "slurm.gpu_type"
    assert warning.message.startswith("ignored: ") and "--constraint" in warning.message


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("--nodes=4", "--nodes is set by cairn"),
        ("-N4", "-N is set by cairn"),
        ("--gres=gpu:2", "--gres is set by cairn"),
        ("--export=ALL", "--export is set by cairn"),
        ("--requeue", "--requeue is set by cairn"),
        ("--exclusive\n#SBATCH --nodes=9", "must not hold a newline"),
        ("--mem=1G\r", "must not hold a newline"),
        ("exclusive", "must be an option"),
        ("", "must be 1-512 characters"),
        ("--comment=" + "x" * 600, "must be 1-512 characters"),
    ],
)
def test_a_refused_sbatch_arg_is_named_by_its_path(arg: str, says: str) -> None:
    """The error names ``slurm.sbatch_args[i]`` of the offending entry and why."""
    with pytest.raises(ConfigError) as caught:
        parse_config(_config({"sbatch_args": ["--exclusive", arg]}))
    [(path, message)] = caught.value.errors
    assert path == "slurm.sbatch_args[1]"
    assert says in message


def test_every_option_cairn_sets_is_refused() -> None:
    """Each of ``SBATCH_ARGS_CAIRN_SETS`` is refused, with or without a value."""
    for option in SBATCH_ARGS_CAIRN_SETS:
        for arg in (option, f"{option}=1" if option.startswith("--") else f"{option}1"):
            with pytest.raises(ConfigError) as caught:
                parse_config(_config({"sbatch_args": [arg]}))
            assert caught.value.paths() == ["slurm.sbatch_args[0]"], arg


def test_several_refused_args_are_each_named() -> None:
    """Two bad entries give two errors, one per index."""
    with pytest.raises(ConfigError) as caught:
        parse_config(_config({"sbatch_args": ["--nodes=2", "--exclusive", "--partition=x"]}))
    assert caught.value.paths() == ["slurm.sbatch_args[0]", "slurm.sbatch_args[2]"]


def test_too_many_sbatch_args_are_refused() -> None:
    """At most 64 entries, as in a pool's ``sbatch_args``."""
    with pytest.raises(ConfigError) as caught:
        parse_config(_config({"sbatch_args": ["--exclusive"] * 65}))
    assert caught.value.paths() == ["slurm.sbatch_args"]


def test_a_stored_config_parses_back_the_same() -> None:
    """The dict form of an accepted section validates again to an equal config."""
    config = parse_config(_config({"slots_per_node": 2, "sbatch_args": ["--exclusive"]}))
    assert parse_config(config.to_dict()) == config
