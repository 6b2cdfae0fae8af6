"""The agent's side of confinement on a real filesystem (as root): who owns a run's
directories, their modes, and a checkpoint directory the run's identity may not write."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from services.agent.confinement import Confinement, RunDirectoryError
from services.confine import Identity

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to a uid needs root")

IDENTITY = Identity(2_000_000_201, 2_000_000_201, "alice")


def owner_and_mode(path: Path) -> tuple[int, int]:
    """``path``'s uid and permission bits."""
    info = path.stat()
    return info.st_uid, stat.S_IMODE(info.st_mode)


def test_a_runs_directories_are_its_identitys_and_the_agents_stay_private(tmp_path: Path) -> None:
    """The work, home, temporary and TensorBoard directories belong to the run's identity (0700),
    the code in the work directory too; the agent's own entries are 0700/0600 and its work
    directory 0711; a checkpoint root the agent creates is 1733, the TensorBoard levels above the
    trial's 0711."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    (agent_dir / "executed-commands").write_text("start:1.1:a\n")
    (agent_dir / "code").mkdir()
    confinement = Confinement(agent_dir)
    confinement.secure_work_dir()
    work = agent_dir / "allocations" / "1.1"
    (work / "pkg").mkdir(parents=True)
    (work / "pkg" / "train.py").write_text("print('hi')")
    os.symlink("/etc/passwd", work / "link")
    root = tmp_path / "ckpt"
    places = confinement.prepare(
        work=work, identity=IDENTITY, checkpoint_dir=root, experiment_id=3, trial_id=7
    )
    me = os.geteuid()
    assert owner_and_mode(agent_dir) == (me, 0o711)
    assert owner_and_mode(agent_dir / "code") == (me, 0o700)
    assert owner_and_mode(agent_dir / "executed-commands") == (me, 0o600)
    for path in (places.work, places.home, places.tmp, places.tensorboard):
        assert owner_and_mode(path) == (IDENTITY.uid, 0o700), path
    assert (work / "pkg" / "train.py").stat().st_uid == IDENTITY.uid
    assert os.lstat(work / "link").st_uid == IDENTITY.uid
    assert Path("/etc/passwd").stat().st_uid == 0  # the link's target was not touched
    assert owner_and_mode(root) == (me, 0o1733)
    assert owner_and_mode(root / "tensorboard") == (me, 0o711)
    assert owner_and_mode(root / "tensorboard" / "experiment") == (me, 0o711)
    assert places.tensorboard == root / "tensorboard/experiment/3/trial/7"
    assert places.home == agent_dir / "homes" / str(IDENTITY.uid)
    confinement.release(places)
    assert not places.tmp.exists()


def test_an_existing_checkpoint_directory_the_identity_cannot_write_fails_the_run(
    tmp_path: Path,
) -> None:
    """A ``shared_fs`` host path that exists and that the identity may not write is refused
    before the run starts, naming the field and the identity; the cluster's default root,
    being the agent's, is made shared instead."""
    agent_dir = tmp_path / "agent"
    admins = tmp_path / "admins"
    admins.mkdir(mode=0o755)
    default = tmp_path / "default"
    default.mkdir(mode=0o755)
    confinement = Confinement(agent_dir, default_checkpoints=default)
    confinement.secure_work_dir()
    work = agent_dir / "allocations" / "1.1"
    work.mkdir(parents=True)
    with pytest.raises(RunDirectoryError, match=r"checkpoint_storage.host_path: .* uid 2000000201"):
        confinement.prepare(
            work=work, identity=IDENTITY, checkpoint_dir=admins, experiment_id=1, trial_id=1
        )
    confinement.prepare(
        work=work, identity=IDENTITY, checkpoint_dir=default, experiment_id=1, trial_id=1
    )
    assert owner_and_mode(default)[1] == 0o1733
