"""How the agent confines a run's code (with :mod:`services.confine`): who it runs as, the
directories it may write, and what of the agent it can reach.

A run's code runs as its owner's unix identity (from the spec's ``agent_user_group``: assigned
by the cluster, or an account an admin linked), never as the agent's uid; an agent that is not
root cannot change uids and runs it as itself (see ``services.confine`` for that mode).

What the identity may write, and nothing else of the agent:

- ``<work_dir>/allocations/<allocation_id>/``: the code and working directory, owned by the
  identity (mode 0700), removed when the run ends;
- ``<work_dir>/homes/<uid>/``: ``HOME`` (caches survive between runs of one identity);
- ``<work_dir>/tmp/<allocation_id>/``: ``TMPDIR``, removed when the run ends;
- the checkpoint directory: one the agent creates is shared (mode 1733: each identity creates
  its own checkpoints, none lists or removes another's); one that already exists must be
  writable by the identity, else the run fails saying so;
- the trial's TensorBoard directory under it, which the agent creates for the identity (the
  levels above it are the agent's, mode 0711).

``<work_dir>`` and its ``allocations/``, ``homes/`` and ``tmp/`` are mode 0711 (no listing) and
everything else of the agent's (code cache, command and exit records, credentials) is 0700 or
0600. In a mount namespace, the work directory
and the cluster's data directory are moreover covered, with only the run's own directories
exposed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from events.domain.config.storage import tensorboard_dir
from events.domain.identities import CLUSTER_UID
from services.confine import (
    SHARED_DIR_MODE,
    ConfinementError,
    Identity,
    View,
    can_change_identity,
    chown_tree,
    confined_argv,
    confined_environment,
    may_write,
)

log = structlog.get_logger("agent")

PRIVATE_MODE = 0o700
TRAVERSE_MODE = 0o711
_PRIVATE_ENTRIES = (
    "code",
    "run-processes",
    "unreported-exits",
    "executed-commands",
    "credential.json",
    "nats.creds",
)


class RunDirectoryError(Exception):
    """A directory the run's code must write cannot be made writable for its identity (the
    message names the config field and what to do)."""


@dataclass(frozen=True)
class RunPlaces:
    """The directories a run's code writes."""

    work: Path
    home: Path
    tmp: Path
    checkpoint_dir: Path
    tensorboard: Path | None
    """The trial's TensorBoard directory (``None`` for a task: it has none)."""
    reads: tuple[Path, ...] = ()
    """Other storage directories the run's code reads (a TensorBoard's experiments'), seen
    in its view; what of them it may read is up to their modes, as for anyone."""


def _mkdir(path: Path, mode: int) -> bool:
    """Creates ``path`` (and missing parents) with exactly ``mode``; whether it was created."""
    if path.is_dir():
        return False
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return True


def _narrow(path: Path, mode: int) -> None:
    """Sets ``path``'s mode if this process owns it (else leaves it, saying so)."""
    if path.stat().st_uid != os.geteuid():
        log.warning("not the owner; mode left as it is", path=str(path), wanted=oct(mode))
        return
    path.chmod(mode)


def _own(path: Path, identity: Identity | None, mode: int = PRIVATE_MODE) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if identity is not None:
        os.lchown(path, identity.uid, identity.gid)
    path.chmod(mode)


class Confinement:
    """The agent's side of confining its runs.

    Args:
        work_dir: the agent's work directory.
        hide: paths no run's code may see (the work directory itself is always hidden).
        default_checkpoints: the cluster's default checkpoint root (the agent's own: it keeps
            its mode 1733 whoever created it).
    """

    def __init__(
        self, work_dir: Path, *, hide: Sequence[Path] = (), default_checkpoints: Path | None = None
    ) -> None:
        self.work_dir = work_dir
        self.hide = tuple(dict.fromkeys([work_dir, *hide]))
        self.default_checkpoints = default_checkpoints

    def identity_for(self, assigned: Identity | None, *, container: bool) -> Identity | None:
        """Who a run's code runs as: the owner's identity from the spec (the cluster's own
        without one), or ``None`` where this agent cannot give the run's directories to
        another uid (it is not root).

        Raises:
            ConfinementError: the agent is root but cannot change a process's uid (no
                ``setpriv``): user code never runs as root.
        """
        if os.geteuid() != 0:
            return None
        if not container and not can_change_identity():
            raise ConfinementError(
                "user code would run as root: install util-linux's setpriv on this agent"
            )
        return assigned or Identity(CLUSTER_UID, CLUSTER_UID, "cairn")

    def secure_work_dir(self) -> None:
        """Gives the work directory its modes: 0711, and 0700 for the agent's own entries
        (those the agent owns: a volume's mount point owned by another user keeps its mode)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        _narrow(self.work_dir, TRAVERSE_MODE)
        for name in _PRIVATE_ENTRIES:
            path = self.work_dir / name
            if path.exists():
                _narrow(path, PRIVATE_MODE if path.is_dir() else 0o600)
        for name in ("allocations", "homes", "tmp"):
            _mkdir(self.work_dir / name, TRAVERSE_MODE)
            _narrow(self.work_dir / name, TRAVERSE_MODE)

    def prepare(
        self,
        *,
        work: Path,
        identity: Identity | None,
        checkpoint_dir: Path,
        experiment_id: int | None,
        trial_id: int | None,
        reads: Sequence[Path] = (),
    ) -> RunPlaces:
        """Makes the run's directories its identity's (``work`` holds the unpacked code); a
        task (no ``experiment_id``/``trial_id``) gets no TensorBoard directory. Of ``reads``
        (directories the run reads, never written here), those that exist stay in its view.

        Raises:
            RunDirectoryError: the checkpoint directory exists and the identity may not write it.
        """
        uid = identity.uid if identity is not None else os.getuid()
        if identity is not None:
            chown_tree(work, identity)
        work.chmod(PRIVATE_MODE)
        home = self.work_dir / "homes" / str(uid)
        _own(home, identity)
        tmp = self.work_dir / "tmp" / work.name
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        _own(tmp, identity)
        self._shared(checkpoint_dir, identity, field="checkpoint_storage.host_path")
        seen = tuple(p for p in dict.fromkeys(reads) if p != checkpoint_dir and p.is_dir())
        if experiment_id is None or trial_id is None:
            return RunPlaces(work, home, tmp, checkpoint_dir, None, seen)
        tensorboard = checkpoint_dir / tensorboard_dir(experiment_id, trial_id)
        try:
            self._tensorboard(checkpoint_dir, tensorboard, identity)
        except OSError as exc:  # TensorBoard files are optional; the trial says if it needs them
            log.warning("no TensorBoard directory for the run", path=str(tensorboard), error=exc)
        return RunPlaces(work, home, tmp, checkpoint_dir, tensorboard)

    def _tensorboard(self, root: Path, trial_dir: Path, identity: Identity | None) -> None:
        """Makes ``<root>/tensorboard/experiment/<experiment>/trial/<trial>`` the identity's.

        The two shared levels are the agent's (mode 0711: traversed, never written by user
        code), so no trial can create another experiment's directory before its owner's runs.
        """
        for shared in (root / "tensorboard", root / "tensorboard" / "experiment"):
            if not _mkdir(shared, TRAVERSE_MODE) and shared.stat().st_uid == os.geteuid():
                shared.chmod(TRAVERSE_MODE)
        for level in (trial_dir.parent.parent, trial_dir.parent, trial_dir):
            if not level.exists():
                _own(level, identity)

    def _shared(self, path: Path, identity: Identity | None, *, field: str) -> None:
        """Makes ``path`` a directory every identity may create entries in."""
        if _mkdir(path, SHARED_DIR_MODE):
            return
        if path == self.default_checkpoints and path.stat().st_uid == os.geteuid():
            path.chmod(SHARED_DIR_MODE)
            return
        if identity is not None and not may_write(path, identity):
            raise RunDirectoryError(
                f"{field}: {path} is not writable by uid {identity.uid} gid {identity.gid}, "
                "which the trial runs as; an admin can make it writable for them (or for "
                "everyone, mode 1733) or link the user to an account that may write there "
                "(cairn user link-with-agent-user)"
            )

    def release(self, places: RunPlaces) -> None:
        """Removes what of the run's directories outlives nothing (``TMPDIR``)."""
        shutil.rmtree(places.tmp, ignore_errors=True)

    def environment(self, identity: Identity | None, places: RunPlaces) -> dict[str, str]:
        """``HOME``, ``USER``, ``LOGNAME`` and ``TMPDIR`` of the run's processes."""
        return confined_environment(identity, home=places.home, tmp=places.tmp)

    def argv(self, argv: Sequence[str], identity: Identity | None, places: RunPlaces) -> list[str]:
        """The command line that runs ``argv`` confined, seeing only the run's directories."""
        view = View(
            hide=self.hide,
            expose=(places.work, places.home, places.tmp, places.checkpoint_dir, *places.reads),
        )
        return confined_argv(argv, identity=identity, view=view)
