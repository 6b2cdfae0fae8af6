"""Where an experiment's checkpoints live on disk (shared by the agents, the tracker and the
Core API; standard library and :mod:`events.settings` only, so training code imports it fast).

A checkpoint is the directory ``<root>/<uuid>``; the root comes from the experiment's
``checkpoint_storage`` (``shared_fs``: ``host_path``/``storage_path``; ``directory``:
``container_path``) or, without one, the cluster default.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from events import settings


def checkpoint_root(storage: Any, default: Path) -> Path:
    """The checkpoint root of a ``checkpoint_storage`` config (shared_fs or directory).

    Args:
        storage: the config's ``checkpoint_storage`` (a mapping, a path string, or ``None``).
        default: the root to use when ``storage`` names none.

    Returns:
        The directory under which each checkpoint is ``<uuid>/``.
    """
    if isinstance(storage, str) and storage:
        return Path(storage)
    if isinstance(storage, Mapping):
        if storage.get("type") == "shared_fs" and storage.get("host_path"):
            host = Path(str(storage["host_path"]))
            sub = storage.get("storage_path")
            return host / str(sub) if sub else host
        if storage.get("type") == "directory" and storage.get("container_path"):
            return Path(str(storage["container_path"]))
    return default


def tensorboard_experiment_dir(experiment_id: int) -> Path:
    """Where an experiment's TensorBoard files go (``trial/<trial id>/`` for each trial),
    relative to the checkpoint storage root (or, in a bucket, to its prefix)."""
    return Path("tensorboard", "experiment", str(experiment_id))


def tensorboard_dir(experiment_id: int, trial_id: int) -> Path:
    """Where a trial's TensorBoard files go, relative to the checkpoint storage root."""
    return tensorboard_experiment_dir(experiment_id) / "trial" / str(trial_id)


def default_checkpoint_root(explicit: Path | str | None = None) -> Path:
    """The cluster's default checkpoint root.

    Args:
        explicit: a root given on the command line, which wins.

    Returns:
        ``explicit``, else ``$CAIRN_CHECKPOINT_ROOT``, else ``$CAIRN_HOME/checkpoints``, else
        ``~/.cairn/checkpoints`` (absolute).
    """
    if explicit:
        return Path(explicit).expanduser().absolute()
    from_env = settings.CHECKPOINT_ROOT.get()
    if from_env is not None:
        return from_env.expanduser().absolute()
    return settings.home_or_user_dir() / "checkpoints"
