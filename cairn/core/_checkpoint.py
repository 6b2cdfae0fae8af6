"""Checkpoints on a shared file system (mirrors ``det.core.CheckpointContext``).

A checkpoint is the directory ``<root>/<uuid>/`` holding the user's files plus ``metadata.json``.
The root is ``CAIRN_CHECKPOINT_DIR`` on a cluster (a shared_fs/directory storage every agent
mounts) or a local directory off-cluster. When a checkpoint is complete the chief reports it
(``kind: checkpoint`` with ``resources`` = {relative path: bytes}).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import shutil
import uuid as uuidlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cairn.core._distributed import DistributedContext
from cairn.core._reporter import Reporter

log = logging.getLogger("cairn.core")

METADATA_FILE = "metadata.json"


class DownloadMode(enum.Enum):
    """How the ranks of one machine fetch a checkpoint they all restore.

    Checkpoints live on storage every agent mounts, so there is nothing to download and both
    modes read the checkpoint in place; the names exist so Determined code ports unchanged.

    Attributes:
        LocalWorkersShareDownload: the local chief fetches, the other local ranks share it.
        NoSharedDownload: every rank fetches on its own.
    """

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


def _resources(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = Path(dirpath) / name
            out[full.relative_to(path).as_posix()] = full.stat().st_size
    return dict(sorted(out.items()))


def _checked(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = dict(metadata or {})
    if "steps_completed" not in meta:
        raise ValueError("checkpoint metadata must contain 'steps_completed'")
    steps = meta["steps_completed"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps_completed must be a non-negative int, got {steps!r}")
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint metadata must be JSON-serialisable: {exc}") from exc
    return meta


class CheckpointContext:
    """Stores, restores, lists and deletes checkpoints under one storage root.

    Args:
        root: the storage root (created on first use).
        reporter: where completed checkpoints are reported.
        distributed: this process's rank (only the chief stores unsharded checkpoints).
        run_id: the trial run the checkpoints belong to.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        reporter: Reporter,
        distributed: DistributedContext,
        run_id: int,
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        self._reporter = reporter
        self._distributed = distributed
        self._run_id = run_id

    def _path(self, storage_id: str) -> Path:
        name = str(storage_id)
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a checkpoint id: {storage_id!r}")
        return self.root / name

    def _complete(self, path: Path, storage_id: str, meta: dict[str, Any]) -> None:
        (path / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
        self._reporter.submit(
            {
                "kind": "checkpoint",
                "uuid": storage_id,
                "steps_completed": meta["steps_completed"],
                "resources": _resources(path),
                "metadata": meta,
                "run_id": self._run_id,
            }
        )

    @contextlib.contextmanager
    def store_path(
        self, metadata: Mapping[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[Path, str]]:
        """Yields ``(directory, uuid)`` to write a checkpoint into; reports it on exit.

        Args:
            metadata: JSON-serialisable dict; must contain ``steps_completed``.
            shard: every rank calls and writes its own files into the same directory.

        Raises:
            ValueError: ``metadata`` lacks ``steps_completed``.
            RuntimeError: a non-chief rank called without ``shard=True``.
        """
        meta = _checked(metadata)
        dist = self._distributed
        if not shard and not dist.is_chief:
            raise RuntimeError("only the chief (rank 0) stores a checkpoint unless shard=True")
        storage_id = str(uuidlib.uuid4())
        if shard:
            storage_id = str(dist.broadcast(storage_id))
        path = self._path(storage_id)
        path.mkdir(parents=True, exist_ok=shard)
        try:
            yield path, storage_id
        except BaseException:
            if dist.is_chief:
                shutil.rmtree(path, ignore_errors=True)
            raise
        if shard:
            dist.allgather(None)  # every rank has finished writing
        if dist.is_chief:
            self._complete(path, storage_id, meta)

    @contextlib.contextmanager
    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
    ) -> Iterator[Path]:
        """Yields the directory of checkpoint ``storage_id`` (read it; do not modify it).

        Args:
            storage_id: the checkpoint's uuid.
            download_mode: accepted for compatibility (see :class:`DownloadMode`).

        Raises:
            FileNotFoundError: no such checkpoint.
            ValueError: ``download_mode`` is not a :class:`DownloadMode`.
        """
        DownloadMode(download_mode)
        path = self._path(storage_id)
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {storage_id} not found under {self.root}")
        yield path

    def upload(
        self, ckpt_dir: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None
    ) -> str:
        """Copies ``ckpt_dir`` into storage as a new checkpoint and reports it.

        Returns:
            The new checkpoint's uuid.
        """
        meta = _checked(metadata)
        if not self._distributed.is_chief:
            raise RuntimeError("only the chief (rank 0) uploads a checkpoint")
        storage_id = str(uuidlib.uuid4())
        path = self._path(storage_id)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copytree(ckpt_dir, path)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        self._complete(path, storage_id, meta)
        return storage_id

    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
    ) -> None:
        """Copies checkpoint ``storage_id`` into ``ckpt_dir`` (created if missing).

        Args:
            storage_id: the checkpoint's uuid.
            ckpt_dir: the destination directory.
            download_mode: accepted for compatibility (see :class:`DownloadMode`).
        """
        with self.restore_path(storage_id, DownloadMode(download_mode)) as path:
            shutil.copytree(path, ckpt_dir, dirs_exist_ok=True)

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The ``metadata.json`` of checkpoint ``storage_id``."""
        with self.restore_path(storage_id) as path:
            data: dict[str, Any] = json.loads((path / METADATA_FILE).read_text())
            return data

    def delete(self, storage_id: str) -> None:
        """Removes checkpoint ``storage_id`` from storage (chief only; missing is fine)."""
        if self._distributed.is_chief:
            shutil.rmtree(self._path(storage_id), ignore_errors=True)

    def checkpoints(self) -> list[tuple[str, dict[str, Any]]]:
        """Complete checkpoints under the root as ``(uuid, metadata)``, oldest step first."""
        found: list[tuple[int, float, str, dict[str, Any]]] = []
        if not self.root.is_dir():
            return []
        for child in self.root.iterdir():
            meta_file = child / METADATA_FILE
            try:
                meta = json.loads(meta_file.read_text())
                found.append(
                    (
                        int(meta.get("steps_completed", 0)),
                        meta_file.stat().st_mtime,
                        child.name,
                        meta,
                    )
                )
            except (OSError, ValueError, TypeError, AttributeError):
                continue
        found.sort(key=lambda f: (f[0], f[1]))
        return [(name, meta) for _, _, name, meta in found]

    def latest(self) -> str | None:
        """The uuid of the checkpoint with the most steps (newest on a tie), or ``None``."""
        listed = self.checkpoints()
        return listed[-1][0] if listed else None
