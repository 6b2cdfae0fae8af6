"""The one way cairn unpacks a tar archive (code tarballs, checkpoints, experiment downloads).

Nothing an archive holds may land outside the target directory, on any Python the project
supports (3.11.2, which the images ship, has no ``filter=`` for ``extractall``), so members are
not handed to :meth:`tarfile.TarFile.extractall` at all. Each member is checked and written here,
one at a time, in archive order:

- its name must be relative, without ``..``, and every directory on its way is opened from a
  descriptor of the target with ``O_NOFOLLOW``: a symbolic link unpacked earlier is never walked
  through (``d/l -> ..`` then ``d/l/m`` is refused however the chain is built), and a file is
  never written through a link (an existing entry is replaced, not opened);
- a symbolic link's target must be relative and, read as written, stay inside the target; once
  everything is unpacked each link is resolved for real and any that leads outside (through
  other links) is removed and the archive refused;
- a hard link becomes a copy of a regular file this archive unpacked before it (never a link to
  anything else on the machine);
- devices, FIFOs and anything else are refused; set-id, sticky and group/other write bits are
  dropped and nothing is chowned;
- the number of members and the unpacked bytes are bounded (:class:`ArchiveLimits`).

A refused archive may leave what was unpacked before the refusal; callers unpack into a fresh
directory.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from lzma import LZMAError
from pathlib import Path
from typing import IO

from events.log.errors import EventsError

GIB = 1 << 30


@dataclass(frozen=True)
class ArchiveLimits:
    """How much one archive may unpack.

    Attributes:
        max_members: the most members (files, directories, links) it may hold.
        max_bytes: the most bytes its files may unpack to (copies of hard links included).
    """

    max_members: int
    max_bytes: int


CODE_LIMITS = ArchiveLimits(max_members=100_000, max_bytes=4 * GIB)
"""An experiment's code (at most 64 MiB packed; its model definition, not its data)."""
CHECKPOINT_LIMITS = ArchiveLimits(max_members=1_000_000, max_bytes=1024 * GIB)
"""A checkpoint or an experiment's checkpoints, downloaded by their owner."""


class ArchiveError(EventsError, tarfile.TarError):
    """The archive is corrupt, unsafe (names the member and why) or past its limits."""


class ArchiveTooLargeError(ArchiveError):
    """The archive holds more members, or unpacks to more bytes, than allowed."""


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_SUBDIR = _DIR | os.O_NOFOLLOW
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


def extract_tar(
    source: Path | bytes, dest: Path, *, limits: ArchiveLimits = CODE_LIMITS
) -> list[str]:
    """Unpacks the tar (any compression) at ``source`` (a path or the bytes) into ``dest``.

    Args:
        source: the archive's path, or its bytes.
        dest: the target directory (created if missing).
        limits: members and bytes allowed (:data:`CODE_LIMITS` by default).

    Returns:
        The relative names of the regular files unpacked, sorted.

    Raises:
        ArchiveError: (a ``tarfile.TarError``) the archive is corrupt, a member would land
            outside ``dest`` or is not a file, directory or link, or it is past ``limits``.
        OSError: ``dest`` cannot be written.
    """
    dest.mkdir(parents=True, exist_ok=True)
    fileobj = io.BytesIO(source) if isinstance(source, bytes) else None
    name = None if isinstance(source, bytes) else source
    root = os.open(dest, _DIR)
    links: set[str] = set()
    try:
        try:
            with tarfile.open(name, mode="r:*", fileobj=fileobj) as tar:
                unpacker = _Unpacker(tar, root, limits, links)
                unpacker.run()
        finally:
            escaping = _remove_escaping_links(dest, links)
        if escaping:
            raise ArchiveError(f"link {escaping!r} leads outside the target through other links")
        return sorted(unpacker.files)
    except (tarfile.ReadError, tarfile.CompressionError, EOFError, zlib.error, LZMAError) as exc:
        raise ArchiveError(f"not a readable tar archive: {exc}") from None
    except OSError as exc:
        if isinstance(exc, ArchiveError) or exc.errno is not None:
            raise
        raise ArchiveError(f"not a readable tar archive: {exc}") from None  # gzip, lzma, bz2
    finally:
        os.close(root)


def _parts(name: str, what: str) -> list[str]:
    """The components of a member's (or hard link target's) name, refused when it is
    absolute or climbs with ``..``."""
    if name.startswith("/") or "\x00" in name:
        raise ArchiveError(f"{what} {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArchiveError(f"{what} {name!r} climbs out with '..'")
    return parts


class _Unpacker:
    """One pass over an archive's members (see the module docstring for the rules)."""

    def __init__(
        self, tar: tarfile.TarFile, root: int, limits: ArchiveLimits, links: set[str]
    ) -> None:
        self.tar = tar
        self.root = root
        self.limits = limits
        self.members = 0
        self.bytes = 0
        self.files: set[str] = set()
        self.links = links

    def run(self) -> None:
        for member in self.tar:
            self.members += 1
            if self.members > self.limits.max_members:
                raise ArchiveTooLargeError(
                    f"the archive holds more than {self.limits.max_members} members (the limit)"
                )
            parts = _parts(member.name, "member")
            if not parts:
                continue  # the target directory itself
            if member.isdir():
                with self._dir(parts, member.name):
                    pass
            elif member.isfile():
                self._count(member.size)
                source = self.tar.extractfile(member)
                assert source is not None
                self._write(parts, member, source)
            elif member.issym():
                self._symlink(parts, member)
            elif member.islnk():
                self._hardlink(parts, member)
            else:
                raise ArchiveError(
                    f"member {member.name!r} is a device, FIFO or other special file"
                )

    def _count(self, size: int) -> None:
        self.bytes += size
        if self.bytes > self.limits.max_bytes:
            raise ArchiveTooLargeError(
                f"the archive unpacks to more than {self.limits.max_bytes} bytes (the limit)"
            )

    @contextlib.contextmanager
    def _dir(self, parts: list[str], name: str) -> Iterator[int]:
        """A descriptor of directory ``parts`` under the root, made where missing, never
        through a link or a file."""
        fd = os.dup(self.root)
        try:
            for i, part in enumerate(parts):
                try:
                    inner = _open_dir(fd, parts[: i + 1], name)
                except FileNotFoundError:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                    inner = _open_dir(fd, parts[: i + 1], name)
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _clear(parent: int, last: str, name: str) -> None:
        """Removes what is at ``last`` (a later member replaces an earlier one), unless it is a
        directory."""
        try:
            info = os.stat(last, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            raise ArchiveError(f"member {name!r} would replace a directory")
        os.unlink(last, dir_fd=parent)

    def _write(self, parts: list[str], member: tarfile.TarInfo, source: IO[bytes]) -> None:
        relative = "/".join(parts)
        with self._dir(parts[:-1], member.name) as parent:
            self._clear(parent, parts[-1], member.name)
            self.links.discard(relative)
            fd = os.open(parts[-1], _NEW_FILE, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, _CHUNK)
            os.fchmod(out.fileno(), (member.mode & 0o755) | 0o600)
            with contextlib.suppress(OSError, OverflowError, ValueError):
                os.utime(out.fileno(), (member.mtime, member.mtime))
        self.files.add(relative)

    def _symlink(self, parts: list[str], member: tarfile.TarInfo) -> None:
        target = member.linkname
        if not target or target.startswith("/") or "\x00" in target:
            raise ArchiveError(f"link {member.name!r} points to an absolute path {target!r}")
        lands = posixpath.normpath(posixpath.join(*parts[:-1], target) if parts[:-1] else target)
        if lands == ".." or lands.startswith("../"):
            raise ArchiveError(f"link {member.name!r} points outside the target ({target!r})")
        relative = "/".join(parts)
        with self._dir(parts[:-1], member.name) as parent:
            self._clear(parent, parts[-1], member.name)
            os.symlink(target, parts[-1], dir_fd=parent)
        self.files.discard(relative)
        self.links.add(relative)

    def _hardlink(self, parts: list[str], member: tarfile.TarInfo) -> None:
        target = "/".join(_parts(member.linkname, f"hard link {member.name!r} to"))
        if target not in self.files:
            raise ArchiveError(
                f"hard link {member.name!r} must name a file unpacked before it, not "
                f"{member.linkname!r}"
            )
        target_parts = target.split("/")
        with self._dir(target_parts[:-1], member.name) as parent:
            try:
                fd = os.open(target_parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=parent)
            except OSError as exc:
                raise ArchiveError(
                    f"hard link {member.name!r}: {target!r} is no longer a file"
                ) from exc
        with os.fdopen(fd, "rb") as source:
            info = os.fstat(source.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ArchiveError(f"hard link {member.name!r}: {target!r} is not a file")
            self._count(info.st_size)
            copy = tarfile.TarInfo(member.name)
            copy.mode, copy.mtime = info.st_mode, int(info.st_mtime)
            self._write(parts, copy, source)


def _open_dir(parent: int, path: list[str], name: str) -> int:
    """Opens the last directory of ``path`` in ``parent`` without following a link.

    Raises:
        ArchiveError: it is a link or a file.
        FileNotFoundError: it is missing.
    """
    try:
        return os.open(path[-1], _SUBDIR, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ArchiveError(
                f"member {name!r} would be unpacked through {'/'.join(path)!r}, which is a "
                "link or a file"
            ) from None
        raise


def _remove_escaping_links(dest: Path, links: set[str]) -> str | None:
    """Removes every link this archive made that, followed for real (through the other links),
    leads out of ``dest``; returns the first one's name, or ``None`` when none does."""
    top = os.path.realpath(dest)
    escaping = []
    for relative in sorted(links):
        real = os.path.realpath(os.path.join(top, relative))
        if real != top and not real.startswith(top.rstrip("/") + "/"):
            escaping.append(relative)
    for relative in escaping:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(top, relative))
    return escaping[0] if escaping else None
