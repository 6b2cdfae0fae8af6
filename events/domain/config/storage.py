"""Where an experiment's checkpoints live on disk: :mod:`events.domain.storage_paths`, named
here too for the config's readers (that module stays outside this package, so the Core API
finds its paths without importing the config models)."""

from __future__ import annotations

from events.domain.storage_paths import (
    checkpoint_root,
    default_checkpoint_root,
    tensorboard_dir,
    tensorboard_experiment_dir,
)

__all__ = [
    "checkpoint_root",
    "default_checkpoint_root",
    "tensorboard_dir",
    "tensorboard_experiment_dir",
]
