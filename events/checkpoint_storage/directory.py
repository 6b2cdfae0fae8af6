"""Checkpoints as directories ``<root>/<uuid>/`` on a file system every agent mounts."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from events.checkpoint_storage.base import CheckpointStorage, StorageError, safe_name, safe_uuid


class DirectoryStorage(CheckpointStorage):
    """Checkpoints under ``root`` (a shared_fs or directory storage, or the cluster default).

    Args:
        root: the directory holding one ``<uuid>/`` directory per checkpoint.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @property
    def location(self) -> str:
        """The root directory."""
        return str(self.root)

    def local_root(self) -> Path:
        """The root directory."""
        return self.root

    def _dir(self, uuid: str) -> Path:
        if not safe_uuid(uuid):
            raise FileNotFoundError(f"not a checkpoint id: {uuid!r}")
        return self.root / uuid

    def _file(self, uuid: str, name: str) -> Path:
        if not safe_name(name):
            raise FileNotFoundError(f"not a file of a checkpoint: {name!r}")
        return self._dir(uuid) / name

    def files(self, uuid: str) -> dict[str, int]:
        """Every file under ``<root>/<uuid>`` with its size."""
        if not safe_uuid(uuid):
            return {}
        path = self.root / uuid
        out: dict[str, int] = {}
        for dirpath, _, names in os.walk(path):
            for name in names:
                full = Path(dirpath) / name
                out[full.relative_to(path).as_posix()] = full.stat().st_size
        return dict(sorted(out.items()))

    def upload(self, source: Path, uuid: str, names: Iterable[str]) -> None:
        """Copies the files into ``<root>/<uuid>``."""
        try:
            for name in names:
                target = self._file(uuid, name)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / name, target)
        except OSError as exc:
            raise StorageError(f"cannot store checkpoint {uuid} under {self.root}: {exc}") from exc

    def put_bytes(self, uuid: str, name: str, data: bytes) -> None:
        """Writes one file."""
        target = self._file(uuid, name)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as exc:
            raise StorageError(f"cannot write {target}: {exc}") from exc

    def read_bytes(self, uuid: str, name: str) -> bytes:
        """Reads one file."""
        return self._file(uuid, name).read_bytes()

    def open(self, uuid: str, name: str) -> BinaryIO:
        """Opens one file."""
        return self._file(uuid, name).open("rb")

    def download(self, uuid: str, target: Path, names: Iterable[str]) -> None:
        """Copies files out of ``<root>/<uuid>``."""
        for name in names:
            destination = target / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self._file(uuid, name), destination)

    def delete(self, uuid: str, names: Iterable[str] | None = None) -> bool:
        """Removes ``<root>/<uuid>`` (or some of its files); a missing one is fine.

        Raises:
            StorageError: the file system refused.
        """
        if not safe_uuid(uuid):
            return False
        path = self.root / uuid
        try:
            if names is not None:
                found = False
                for name in names:
                    try:
                        self._file(uuid, name).unlink()
                        found = True
                    except FileNotFoundError:
                        continue
                return found
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StorageError(f"{path}: {exc.strerror or exc}") from exc
        return True

    def uuids(self) -> list[str]:
        """The names of the directories under the root."""
        if not self.root.is_dir():
            return []
        return sorted(child.name for child in self.root.iterdir() if child.is_dir())
