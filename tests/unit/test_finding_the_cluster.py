"""A newcomer's CLI finds the cluster ``make demo`` started, from any directory, and the demo
prints commands that run where ``cairn`` is not on the PATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cairn.cli.demo import cairn_command
from cairn.local.layout import default_data_dir
from cairn.local.state import STATE_FILE, remember_cluster, remembered_cluster


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home directory and an empty working directory, with no CAIRN_HOME."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CAIRN_HOME", raising=False)
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path / "home"


def started(path: Path) -> Path:
    """A data directory as ``cairn up`` leaves it (its state file written)."""
    path.mkdir(parents=True)
    (path / STATE_FILE).write_text("{}")
    return path


def test_the_cluster_started_last_is_found_from_another_directory(
    home: Path, tmp_path: Path
) -> None:
    """After ``cairn up`` in a checkout, the CLI run from elsewhere finds that cluster."""
    demo = started(tmp_path / "checkout" / ".cairn")
    remember_cluster(demo)
    assert (home / ".cairn" / "last-cluster").stat().st_mode & 0o777 == 0o600
    assert default_data_dir() == demo


def test_a_cluster_here_or_cairn_home_wins_over_the_remembered_one(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``./.cairn`` with a cluster beats the remembered one, and ``$CAIRN_HOME`` beats both."""
    remember_cluster(started(tmp_path / "checkout" / ".cairn"))
    here = started(Path(".cairn").resolve())
    assert default_data_dir() == here
    monkeypatch.setenv("CAIRN_HOME", str(tmp_path / "mine"))
    assert default_data_dir() == tmp_path / "mine"


def test_a_remembered_cluster_whose_directory_is_gone_is_forgotten(
    home: Path, tmp_path: Path
) -> None:
    """A pointer to a deleted data directory falls back to ``./.cairn``."""
    remember_cluster(tmp_path / "gone" / ".cairn")
    assert remembered_cluster() is None
    assert default_data_dir() == Path(".cairn").resolve()


def test_demo_prints_a_full_path_when_cairn_is_not_on_the_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no ``cairn`` on the PATH the printed commands use the script beside this Python."""
    monkeypatch.setenv("PATH", "/nonexistent")
    command = cairn_command()
    script = Path(sys.executable).parent / "cairn"
    assert command == (str(script) if script.exists() else f"{sys.executable} -m cairn")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    if script.exists():
        assert cairn_command() == "cairn"
