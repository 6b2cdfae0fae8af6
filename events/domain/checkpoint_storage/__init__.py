"""Where checkpoint files live: a directory every agent mounts, or an S3-compatible bucket.

A checkpoint is a set of files named by paths relative to the checkpoint (``/``-separated),
``metadata.json`` among them, stored under the checkpoint's uuid. Training code writes and
reads them (``cairn.core``), the tracker's GC deletes them, the API streams them as a tar.gz;
:func:`open_storage` gives each the storage of an experiment's ``checkpoint_storage`` config.

The storage policy (:mod:`events.domain.checkpoint_storage.policy`) reads the cluster config's
models, so it is imported only when used: training code that imports this package for its
storages does not load the config models (pydantic) at every start.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from events.domain.checkpoint_storage.base import (
    MARKER_FILE,
    CheckpointStorage,
    StorageError,
    marker_bytes,
    safe_uuid,
)
from events.domain.checkpoint_storage.directory import DirectoryStorage
from events.domain.checkpoint_storage.s3 import S3Storage
from events.domain.storage_paths import checkpoint_root

if TYPE_CHECKING:
    from events.domain.checkpoint_storage.policy import StorageNotAllowedError, check_storage
    from events.domain.config.cluster import CheckpointStoragePolicy


def open_storage(
    config: Any, default_root: Path, *, policy: CheckpointStoragePolicy | None
) -> CheckpointStorage:
    """The storage of a ``checkpoint_storage`` config.

    Args:
        config: the experiment's ``checkpoint_storage`` (a mapping or ``None``); ``s3`` opens the
            bucket, ``shared_fs``/``directory`` their directory, anything else (no type, or
            gcs/azure, which cairn accepts with a warning) the cluster default.
        default_root: the cluster's default checkpoint root.
        policy: the cluster config's storage policy, which the services always pass; ``None``
            only in the user's own processes (the Core API), which reach what the user can.

    Returns:
        The storage.

    Raises:
        StorageNotAllowedError: the policy does not allow ``config``.
    """
    if policy is not None:
        from events.domain.checkpoint_storage.policy import check_storage

        check_storage(config, policy, default_root=default_root)
    if isinstance(config, Mapping) and config.get("type") == "s3":
        return S3Storage.from_config(config)
    return DirectoryStorage(checkpoint_root(config, default_root))


__all__ = [
    "MARKER_FILE",
    "CheckpointStorage",
    "DirectoryStorage",
    "S3Storage",
    "StorageError",
    "StorageNotAllowedError",
    "check_storage",
    "marker_bytes",
    "open_storage",
    "safe_uuid",
]


_LAZY = frozenset({"StorageNotAllowedError", "check_storage"})

if not TYPE_CHECKING:  # type checkers see the names imported above, and no catch-all

    def __getattr__(name: str) -> Any:
        """The policy's names, imported on first use (see the module docstring)."""
        if name in _LAZY:
            from events.domain.checkpoint_storage import policy

            return getattr(policy, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
