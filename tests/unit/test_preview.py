"""preview-search: the simulation behind it and the CLI verb."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from events.domain.config import parse_config
from events.domain.search.preview import preview_search, render_preview
from events.domain.search.sampling import grid_size

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "asha" / "adaptive.yaml"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cairn", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_previews_the_adaptive_example_with_its_rungs() -> None:
    """`cairn preview-search examples/asha/adaptive.yaml` exits 0 and prints every rung."""
    done = cli("preview-search", str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "This search will create a total of 16 trial(s)." in out
    assert "Bracket 1: 3 rung(s), 12 trial(s)" in out and "Bracket 2: 2 rung(s), 4 trial(s)" in out
    for units in ("58", "234", "937"):
        assert f" {units} " in out


def test_cli_rejects_a_bad_config_with_the_field_path_on_stderr() -> None:
    """A config made invalid by --config exits non-zero and names searcher.max_trials."""
    done = cli("preview-search", str(EXAMPLE), "--config", "searcher.max_trials=0")
    assert done.returncode != 0
    assert "searcher.max_trials: must be >= 1, got 0" in done.stderr
    assert done.stdout == ""


def test_cli_json_output_matches_the_library_result() -> None:
    """--json prints the PreviewResult of the same config (seed 0 when none is set)."""
    done = cli("--json", "preview-search", str(EXAMPLE), "--config", "searcher.max_trials=8")
    assert done.returncode == 0, done.stderr
    expected = preview_search(
        parse_config(EXAMPLE.read_text(), ["searcher.max_trials=8"], default_seed=0)
    )
    assert json.loads(done.stdout) == json.loads(json.dumps(expected.to_dict()))


def test_asha_preview_accounts_for_every_trial_at_rung_lengths() -> None:
    """Every trial trains to one of its bracket's rungs; rungs thin out from bottom to top."""
    config = parse_config(EXAMPLE.read_text(), default_seed=3)
    result = preview_search(config)
    assert result.total_trials == 16 and result.unit == "batches" and result.max_time == 937
    assert sum(row.trials for row in result.lengths) == 16
    assert {row.units for row in result.lengths} <= {58, 234, 937}
    for bracket in result.brackets:
        rows = [r for r in result.rungs if r.bracket == bracket.bracket]
        assert rows[0].trials == bracket.max_trials
        assert all(a.trials >= b.trials for a, b in itertools.pairwise(rows))
        assert rows[-1].stopped == rows[-1].trials  # the top rung stops everyone
        assert sum(r.stopped for r in rows) == bracket.max_trials
    assert result.total_units == sum(r.trials * (r.units or 0) for r in result.lengths)
    assert preview_search(config) == result  # deterministic for a given seed


def test_grid_and_random_previews_count_trials_times_length() -> None:
    """Non-ASHA searchers run every trial to max_length (or to what the code decides)."""
    grid = parse_config(
        {
            "searcher": {"name": "grid", "metric": "m", "max_length": {"epochs": 2}},
            "hyperparameters": {
                "a": {"type": "int", "minval": 1, "maxval": 3, "count": 3},
                "b": {"type": "categorical", "vals": ["x", "y"]},
            },
        },
        default_seed=0,
    )
    result = preview_search(grid)
    assert result.total_trials == grid_size(grid.hyperparameters) == 6
    assert result.total_units == 12 and result.unit == "epochs"
    plain = preview_search(
        parse_config({"searcher": {"name": "random", "metric": "m", "max_trials": 5}})
    )
    assert plain.total_trials == 5 and plain.total_units is None
    assert "chosen by the code" in render_preview(plain)


TPE_YAML = """\
name: tpe-demo
entrypoint: python3 train.py
hyperparameters:
  lr: {type: log, minval: -4, maxval: -1}
  width: {type: int, minval: 8, maxval: 64}
searcher:
  name: tpe
  metric: loss
  max_trials: 20
  max_concurrent_trials: 4
  n_startup_trials: 5
  max_length: {batches: 100}
"""


def test_cli_previews_a_tpe_search_and_names_a_bad_tpe_knob(tmp_path: Path) -> None:
    """A tpe search previews as max_trials trials of max_length; a bad knob is named by path."""
    path = tmp_path / "tpe.yaml"
    path.write_text(TPE_YAML)
    done = cli("preview-search", str(path))
    assert done.returncode == 0, done.stderr
    assert "Search: tpe on 'loss'" in done.stdout
    assert "This search will create a total of 20 trial(s)." in done.stdout
    assert "Total training: 2000 batches." in done.stdout
    bad = cli("preview-search", str(path), "--config", "searcher.n_startup_trials=21")
    assert bad.returncode != 0 and bad.stdout == ""
    assert "searcher.n_startup_trials: must be at most max_trials (20), got 21" in bad.stderr
