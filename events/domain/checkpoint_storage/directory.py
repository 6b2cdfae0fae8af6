"""Checkpoints as directories ``<root>/<uuid>/`` on a file system every agent mounts.

Nothing here follows a symbolic link below the root: every path is walked one component at a
time from a descriptor of the root (``O_NOFOLLOW``), so a checkpoint directory replaced by a
link, or a link inside a checkpoint, is neither read, listed, written through nor deleted
through, and no operation leaves ``<root>/<uuid>``. Only regular files are listed and read.
The root itself is the administrator's (it may be a link); which roots are allowed is
:mod:`events.domain.checkpoint_storage.policy`'s business.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from events.domain.checkpoint_storage.base import (
    MARKER_FILE,
    CheckpointStorage,
    StorageError,
    safe_name,
    safe_uuid,
)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_SUBDIR = _DIR | os.O_NOFOLLOW
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# What opening a path through a link, or a file as a directory, raises.
_NOT_THERE = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EMLINK)


def _missing(exc: OSError, what: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, f"{what}: {exc.strerror or exc}")


def _open_subdir(name: str, dir_fd: int, what: str) -> int:
    """A descriptor of directory ``name`` in ``dir_fd``, opened without following a link.

    Raises:
        FileNotFoundError: it is missing, a link or not a directory (``what`` names it).
    """
    try:
        return os.open(name, _SUBDIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _NOT_THERE:
            raise _missing(exc, what) from None
        raise


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

    # -- descriptors, never through a link below the root

    @contextlib.contextmanager
    def _root_fd(self) -> Iterator[int]:
        """A descriptor of the root.

        Raises:
            FileNotFoundError: there is no root (so no checkpoint either).
            StorageError: the root is not a directory, or not readable.
        """
        try:
            fd = os.open(self.root, _DIR)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"checkpoint root {self.root}: {exc.strerror or exc}") from exc
        try:
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _dir_fd(self, uuid: str, parts: Iterable[str] = ()) -> Iterator[int]:
        """A descriptor of ``<root>/<uuid>/<parts...>``, each component opened ``O_NOFOLLOW``.

        Raises:
            FileNotFoundError: a component is missing, a link or not a directory.
        """
        if not safe_uuid(uuid):
            raise FileNotFoundError(errno.ENOENT, f"not a checkpoint id: {uuid!r}")
        with self._root_fd() as root:
            fd = _open_subdir(uuid, root, f"{self.root}/{uuid}")
        try:
            for part in parts:
                inner = _open_subdir(part, fd, f"{self.root}/{uuid}: {part}")
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    def _split(self, uuid: str, name: str) -> tuple[list[str], str]:
        if not safe_name(name):
            raise FileNotFoundError(errno.ENOENT, f"not a file of a checkpoint: {name!r}")
        *parents, last = name.split("/")
        return parents, last

    # -- reading

    def files(self, uuid: str) -> dict[str, int]:
        """Every regular file under ``<root>/<uuid>`` with its size (links and the marker
        left out)."""
        out: dict[str, int] = {}
        try:
            with self._dir_fd(uuid) as top:
                for dirpath, _, names, dirfd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                    for name in names:
                        info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                        relative = posixpath.normpath(posixpath.join(dirpath, name))
                        if stat.S_ISREG(info.st_mode) and relative != MARKER_FILE:
                            out[relative] = info.st_size
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StorageError(f"cannot list {self.root}/{uuid}: {exc.strerror or exc}") from exc
        return dict(sorted(out.items()))

    def open(self, uuid: str, name: str) -> BinaryIO:
        """Opens one regular file of the checkpoint for reading (never through a link).

        Raises:
            FileNotFoundError: no such regular file (a link, a directory, a device...).
        """
        parents, last = self._split(uuid, name)
        with self._dir_fd(uuid, parents) as parent:
            try:
                before = os.stat(last, dir_fd=parent, follow_symlinks=False)
                if not stat.S_ISREG(before.st_mode):
                    raise FileNotFoundError(errno.ENOENT, f"not a regular file: {name!r}")
                fd = os.open(last, _FILE, dir_fd=parent)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) or exc.errno in _NOT_THERE:
                    raise _missing(exc, f"{self.root}/{uuid}/{name}") from None
                raise
        after = os.fstat(fd)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, f"{name!r} changed while being opened")
        return os.fdopen(fd, "rb")

    def read_bytes(self, uuid: str, name: str) -> bytes:
        """Reads one file."""
        with self.open(uuid, name) as fh:
            return fh.read()

    def download(self, uuid: str, target: Path, names: Iterable[str]) -> None:
        """Copies files out of ``<root>/<uuid>``."""
        for name in names:
            destination = target / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            with self.open(uuid, name) as source, destination.open("wb") as out:
                shutil.copyfileobj(source, out)

    def uuids(self) -> list[str]:
        """The names of the directories (not links) under the root."""
        try:
            with os.scandir(self.root) as entries:
                return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    # -- writing

    def _write(self, uuid: str, name: str, write: Callable[[BinaryIO], None]) -> None:
        parents, last = self._split(uuid, name)
        try:
            with self._root_fd() as root, contextlib.suppress(FileExistsError):
                os.mkdir(uuid, 0o755, dir_fd=root)
            made: list[str] = []
            for part in parents:
                with self._dir_fd(uuid, made) as parent, contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=parent)
                made.append(part)
            with self._dir_fd(uuid, parents) as parent:
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISLNK(os.stat(last, dir_fd=parent, follow_symlinks=False).st_mode):
                        os.unlink(last, dir_fd=parent)
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(last, flags, 0o644, dir_fd=parent)
            with os.fdopen(fd, "wb") as out:
                write(out)
        except OSError as exc:
            raise StorageError(
                f"cannot write {self.root}/{uuid}/{name}: {exc.strerror or exc}"
            ) from exc

    def upload(self, source: Path, uuid: str, names: Iterable[str]) -> None:
        """Copies the files into ``<root>/<uuid>``."""
        for name in names:

            def copy(out: BinaryIO, name: str = name) -> None:
                with (source / name).open("rb") as src:
                    shutil.copyfileobj(src, out)

            self._write(uuid, name, copy)

    def put_bytes(self, uuid: str, name: str, data: bytes) -> None:
        """Writes one file."""

        def write(out: BinaryIO) -> None:
            out.write(data)

        self._write(uuid, name, write)

    # -- deleting

    def delete(self, uuid: str, names: Iterable[str] | None = None) -> bool:
        """Removes ``<root>/<uuid>`` (or some of its files); a missing one is fine.

        A link is removed as a link (never followed): a checkpoint that is itself a link is
        left alone and counts as missing, and links inside it are unlinked, not descended.

        Raises:
            StorageError: the file system refused.
        """
        if not safe_uuid(uuid):
            return False
        try:
            if names is not None:
                return self._delete_files(uuid, names)
            with self._root_fd() as root:
                try:
                    info = os.stat(uuid, dir_fd=root, follow_symlinks=False)
                except FileNotFoundError:
                    return False
                if not stat.S_ISDIR(info.st_mode):
                    return False
                shutil.rmtree(uuid, dir_fd=root)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StorageError(f"{self.root}/{uuid}: {exc.strerror or exc}") from exc
        return True

    def _delete_files(self, uuid: str, names: Iterable[str]) -> bool:
        found = False
        for name in names:
            try:
                parents, last = self._split(uuid, name)
                with self._dir_fd(uuid, parents) as parent:
                    if stat.S_ISDIR(os.stat(last, dir_fd=parent, follow_symlinks=False).st_mode):
                        continue
                    os.unlink(last, dir_fd=parent)
                    found = True
            except FileNotFoundError:
                continue
        return found
