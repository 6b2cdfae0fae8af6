"""Unpacking tar archives of code and checkpoints so that nothing lands outside the target."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path


def extract_tar(source: Path | bytes, dest: Path) -> list[str]:
    """Unpacks the tar (any compression) at ``source`` (a path or the bytes) into ``dest``.

    Returns:
        The names of the regular files unpacked, sorted.

    Raises:
        tarfile.TarError: the archive is corrupt or a member would land outside ``dest``.
        OSError: ``dest`` cannot be written.
    """
    dest.mkdir(parents=True, exist_ok=True)
    fileobj = io.BytesIO(source) if isinstance(source, bytes) else None
    name = None if isinstance(source, bytes) else source
    with tarfile.open(name, mode="r:*", fileobj=fileobj) as tar:
        members = tar.getmembers()
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python before 3.11.4 (Debian 12's 3.11.2, in the cairn images)
            tar.extractall(dest, members=safe_members(tar, dest))
    return sorted(m.name for m in members if m.isfile())


def safe_members(tar: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    """The members of ``tar`` if all of them stay inside ``dest`` (what the ``data`` filter of
    newer Pythons checks): regular files, directories and links whose paths and link targets
    resolve under ``dest``; group/other write and set-id bits are dropped.

    Raises:
        tarfile.TarError: a member is absolute, escapes ``dest``, or is a device or FIFO.
    """
    root = dest.resolve()
    out = []
    for member in tar.getmembers():
        where = (root / member.name).resolve()
        if os.path.isabs(member.name) or not where.is_relative_to(root):
            raise tarfile.TarError(f"{member.name!r} lies outside the destination")
        if member.issym() or member.islnk():
            base = where.parent if member.issym() else root
            target = (base / member.linkname).resolve()
            if os.path.isabs(member.linkname) or not target.is_relative_to(root):
                raise tarfile.TarError(f"{member.name!r} links outside the destination")
        elif not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"{member.name!r} is a device or FIFO")
        member.mode &= 0o755
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        out.append(member)
    return out
