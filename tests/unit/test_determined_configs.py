"""The compatibility suite: configs written the way Determined's docs write them are accepted,
accepted with one warning per ignored path, or refused with the path, as each file's
``# expect:`` header says; ``cairn preview-search DIR`` prints one line per file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from events.domain.config import ConfigError, parse_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "fixtures" / "determined_configs"
FILES = sorted(CONFIGS.glob("*.yaml"))
COMPAT = ROOT / "examples" / "determined_compat"


def expectation(path: Path) -> tuple[str, list[str]]:
    """The ``# expect: VERDICT[: path, path...]`` header of a config file."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} has no '# expect:' header"
    verdict, _, rest = first.removeprefix("# expect: ").partition(":")
    return verdict.strip(), [p.strip() for p in rest.split(",") if p.strip()]


def test_the_suite_covers_every_searcher_and_verdict() -> None:
    """The directory holds each searcher, both log_policies forms, s3 storage and all verdicts."""
    texts = "\n".join(p.read_text() for p in FILES)
    for name in ("single", "random", "grid", "async_halving", "adaptive_asha"):
        assert f"name: {name}" in texts, name
    assert (
        "type: s3" in texts and "action: cancel_retries" in texts and "type: exclude_node" in texts
    )
    assert {expectation(p)[0] for p in FILES} == {"accepted", "warnings", "refused"}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_determined_config(path: Path) -> None:
    """The config is accepted / warned about (exactly these paths, once each) / refused at the
    path its header names."""
    verdict, paths = expectation(path)
    text = path.read_text(encoding="utf-8")
    if verdict == "refused":
        with pytest.raises(ConfigError) as caught:
            parse_config(text, default_seed=1)
        assert caught.value.paths()[0] == paths[0], caught.value
        return
    config = parse_config(text, default_seed=1)
    warned = [w.path for w in config.warnings]
    assert len(warned) == len(set(warned)), "one warning per path"
    assert sorted(warned) == sorted(paths if verdict == "warnings" else [])
    for warning in config.warnings:
        assert warning.message.startswith("ignored: "), warning
    again = parse_config(config.to_dict())
    assert again.warnings == config.warnings, "a stored config gives the same warnings"


def test_preview_search_over_a_directory_prints_one_line_per_file() -> None:
    """``cairn preview-search DIR`` prints each file's verdict (with the refused path) and, for
    an accepted one, what its search would run; then the totals; it exits 1 because some are
    refused."""
    result = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "preview-search", str(CONFIGS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == len(FILES) + 1
    for path, line in zip(FILES, lines, strict=False):
        verdict, paths = expectation(path)
        assert line.startswith(path.name), line
        if verdict == "accepted":
            assert re.search(r"  accepted \(\w+: \d+ trials?(, \d+ \w+ in all)?\)$", line), line
        elif verdict == "warnings":
            assert re.search(r"  accepted \(\w+: \d+ trials?[^)]*\) with warnings: ignored ", line)
            assert paths[0] in line, line
        else:
            assert f"refused: {paths[0]}:" in line, line
    counts = [expectation(p)[0] for p in FILES]
    assert re.fullmatch(
        f"{len(FILES)} configs: {counts.count('accepted')} accepted, "
        f"{counts.count('warnings')} accepted with warnings, {counts.count('refused')} refused; "
        r"\d+ trials in all",
        lines[-1],
    ), lines[-1]


def test_preview_search_summarises_the_compat_examples() -> None:
    """Over ``examples/determined_compat`` every config is accepted, each line says what its
    search would run (e.g. the grid's two trials) and the total counts the trials of all."""
    result = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "preview-search", str(COMPAT)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    by_file = {line.split()[0]: line for line in lines[:-1]}
    assert re.search(r" accepted \(grid: 2 trials, 8 batches in all\)$", by_file["grid.yaml"])
    assert re.search(r" accepted \(single: 1 trial, 4 batches in all\)$", by_file["metrics.yaml"])
    files = len(list(COMPAT.glob("*.yaml")))
    assert lines[-1] == (
        f"{files} configs: {files - 1} accepted, 1 accepted with warnings, 0 refused; "
        "23 trials in all"
    )
