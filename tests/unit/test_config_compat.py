"""Determined-compatible config fields: nulls, device maps, storage types, log policies,
accepted-but-ignored warnings, secrets masking and the ExperimentSubmitted v1 -> v2 upcast."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from events.domain.config import (
    ClusterDefaultStorage,
    ConfigError,
    S3Storage,
    parse_config,
)
from events.domain.config.secrets import MASK, mask_payload, mask_secrets
from events.domain.config.storage import checkpoint_root
from events.log.registry import decode
from services.api.views import environment_variables
from services.tracker.gc import GCPolicy

ROOT = Path(__file__).resolve().parents[2]
SEARCHER = "searcher: {name: single, metric: loss}\n"


def test_gpu_is_read_as_cuda_in_image_and_environment_maps() -> None:
    """``gpu`` lists (Determined's older key) become ``cuda`` and reach a CUDA trial's env."""
    config = parse_config(
        SEARCHER + "environment:\n  image: {cpu: c, gpu: g}\n"
        "  environment_variables: {cpu: [A=1], gpu: [B=2]}\n"
    )
    dumped = config.to_dict()
    assert dumped["environment"]["image"] == {"cpu": "c", "cuda": "g", "rocm": None}
    assert environment_variables(dumped, "cuda") == {"B": "2"}
    assert environment_variables(dumped, "cpu") == {"A": "1"}


def test_cuda_wins_over_gpu_when_both_are_given() -> None:
    """As in Determined, ``gpu`` is used only when ``cuda`` is absent."""
    config = parse_config(SEARCHER + "environment:\n  image: {cuda: new, gpu: old}\n")
    assert config.to_dict()["environment"]["image"]["cuda"] == "new"


def test_null_means_default_except_in_user_data() -> None:
    """A null field takes its default; a null in ``data`` or a const value stays null."""
    config = parse_config(
        "searcher: {name: random, metric: loss, max_trials: 2, max_concurrent_trials: null}\n"
        "max_restarts: null\nresources: {slots_per_trial: null}\n"
        "data: {token: null}\nhyperparameters: {x: {type: const, val: null}}\n"
    )
    assert config.max_restarts == 5
    assert config.resources.slots_per_trial == 1
    assert config.searcher.max_concurrent_trials == 16  # type: ignore[union-attr]
    assert config.data == {"token": None}
    assert config.to_dict()["hyperparameters"]["x"]["val"] is None


def test_storage_without_type_is_the_cluster_default_with_its_gc_policy(tmp_path: Path) -> None:
    """``checkpoint_storage`` with only save_* fields uses the default root and that policy."""
    config = parse_config(SEARCHER + "checkpoint_storage: {save_trial_best: 3}\n")
    assert isinstance(config.checkpoint_storage, ClusterDefaultStorage)
    stored = config.to_dict()["checkpoint_storage"]
    assert checkpoint_root(stored, tmp_path) == tmp_path
    assert GCPolicy.from_storage(stored).save_trial_best == 3
    assert parse_config(config.to_dict()).checkpoint_storage == config.checkpoint_storage


def test_storage_without_type_but_with_other_fields_asks_for_type() -> None:
    """``host_path`` without ``type`` is refused at checkpoint_storage.type, saying why."""
    with pytest.raises(ConfigError) as caught:
        parse_config(SEARCHER + "checkpoint_storage: {host_path: /mnt}\n")
    assert caught.value.paths() == ["checkpoint_storage.type"]
    assert "host_path" in str(caught.value)


def test_s3_storage_is_honoured_and_gcs_is_warned_about() -> None:
    """s3 parses into S3Storage without a warning; gcs warns that the default storage is used."""
    s3 = parse_config(SEARCHER + "checkpoint_storage: {type: s3, bucket: b, prefix: p}\n")
    assert isinstance(s3.checkpoint_storage, S3Storage) and not s3.warnings
    gcs = parse_config(SEARCHER + "checkpoint_storage: {type: gcs, bucket: b}\n")
    [warning] = gcs.warnings
    assert warning.path == "checkpoint_storage"
    assert "cluster's default storage" in warning.message


def test_azure_needs_exactly_one_way_in() -> None:
    """Determined's azure rule: exactly one of connection_string and account_url."""
    with pytest.raises(ConfigError) as caught:
        parse_config(
            SEARCHER + "checkpoint_storage: {type: azure, container: c, connection_string: x, "
            "account_url: y}\n"
        )
    assert caught.value.paths() == ["checkpoint_storage"]


def test_both_log_policy_forms_are_accepted_and_a_bad_action_is_refused() -> None:
    """Named policies and the older ``{pattern, action: {type}}`` form parse; an unknown action
    type is refused at its path."""
    config = parse_config(
        SEARCHER + "log_policies:\n  - {name: a, pattern: x, action: exclude_node}\n"
        "  - {pattern: y, action: {type: cancel_retries}}\n  - {name: b, pattern: null}\n"
    )
    assert len(config.log_policies) == 3
    with pytest.raises(ConfigError) as caught:
        parse_config(SEARCHER + "log_policies: [{pattern: y, action: {type: reboot}}]\n")
    assert caught.value.paths() == ["log_policies[0].action.type"]


def test_defaults_written_out_are_not_warned_about() -> None:
    """Setting an ignored field to its default (profiling off, scheduling_unit 100) warns not."""
    config = parse_config(
        SEARCHER + "profiling: {enabled: false}\nscheduling_unit: 100\ndebug: false\n"
        "checkpoint_policy: best\nresources: {native_parallel: false}\n"
    )
    assert config.warnings == ()


def test_removed_searchers_are_refused_with_the_reason() -> None:
    """custom/adaptive/adaptive_simple/sync_halving are refused as Determined 0.38 does."""
    for name in ("custom", "adaptive", "adaptive_simple", "sync_halving"):
        with pytest.raises(ConfigError) as caught:
            parse_config(f"searcher: {{name: {name}, metric: loss}}\n")
        assert caught.value.paths() == ["searcher.name"]
        assert "removed in Determined 0.38" in str(caught.value)


def test_limits_still_hold_for_new_sections() -> None:
    """The project's bounds still apply (max_restarts), next to Determined's own (retention)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(
            SEARCHER + "max_restarts: 10001\nretention_policy: {log_retention_days: 40000}\n"
        )
    assert set(caught.value.paths()) == {"max_restarts", "retention_policy.log_retention_days"}


def test_secrets_are_masked_and_the_input_is_left_alone() -> None:
    """Storage keys, registry passwords and Pachyderm tokens are masked in a copy."""
    config = {
        "checkpoint_storage": {"type": "s3", "bucket": "b", "access_key": "A", "secret_key": "S"},
        "environment": {"registry_auth": {"username": "u", "password": "p"}},
        "integrations": {"pachyderm": {"dataset": {"token": "t", "repo": "r"}}},
    }
    masked = mask_secrets(config)
    assert masked["checkpoint_storage"] == {
        "type": "s3",
        "bucket": "b",
        "access_key": MASK,
        "secret_key": MASK,
    }
    assert masked["environment"]["registry_auth"] == {"username": "u", "password": MASK}
    assert masked["integrations"]["pachyderm"]["dataset"] == {"token": MASK, "repo": "r"}
    assert config["checkpoint_storage"]["secret_key"] == "S"
    payload = mask_payload("ExperimentSubmitted", {"config": config, "experiment_id": 1})
    assert payload["config"]["checkpoint_storage"]["secret_key"] == MASK
    assert mask_payload("TrialStarted", {"config": config})["config"] is config


def test_experiment_submitted_v1_upcasts_to_no_warnings() -> None:
    """A v1 payload (before warnings were recorded) decodes with an empty warnings list."""
    event = decode(
        "ExperimentSubmitted",
        1,
        {"experiment_id": 3, "config": {"searcher": {"name": "single", "metric": "x"}}},
    )
    assert event.warnings == []  # type: ignore[attr-defined]


def test_preview_search_prints_warnings_of_one_config(tmp_path: Path) -> None:
    """``cairn preview-search FILE`` shows each ignored path on stderr, and still previews."""
    path = tmp_path / "exp.yaml"
    path.write_text(SEARCHER + "slurm: {gpu_type: a100}\nresources: {agent_label: x}\n")
    result = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "preview-search", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        "warning: resources.agent_label: ignored: removed from Determined in 0.20.0; "
        "use resource_pool",
        "warning: slurm.gpu_type: ignored: Slurm jobs ask for GPUs by count (--gres=gpu:N); "
        "choose a GPU type with the pool's partition or a --constraint in slurm.sbatch_args",
    ]
