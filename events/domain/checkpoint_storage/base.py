"""The interface every checkpoint storage implements, its error, and the checkpoint marker.

The marker is the file :data:`MARKER_FILE` that the Core API writes into every checkpoint it
saves (before ``metadata.json``), holding the checkpoint's uuid. The services delete or serve a
checkpoint only when its marker is there and names it (:meth:`CheckpointStorage.owned`), so a
directory or prefix that cairn did not write is never removed or sent, whatever a report said.
The marker is cairn's, not the user's: it is not listed among a checkpoint's files.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

from events.log.errors import EventsError

MARKER_FILE = ".cairn-checkpoint"
"""The marker's name inside a checkpoint (``<root>/<uuid>/.cairn-checkpoint``)."""

MAX_MARKER_BYTES = 4096
"""The most of a marker that is read (a real one is a few dozen bytes)."""


def marker_bytes(uuid: str) -> bytes:
    """The contents of checkpoint ``uuid``'s marker."""
    return json.dumps({"uuid": uuid}).encode()


def is_marker_of(data: bytes, uuid: str) -> bool:
    """Whether ``data`` (a marker's contents) marks checkpoint ``uuid``."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("uuid") == uuid


class StorageError(EventsError):
    """Checkpoint storage could not be read or written (the message names where)."""


def safe_uuid(uuid: str) -> bool:
    """Whether ``uuid`` can name a checkpoint: one plain path component."""
    return bool(uuid) and uuid not in (".", "..") and "/" not in uuid and "\\" not in uuid


def safe_name(name: str) -> bool:
    """Whether ``name`` is a relative file path inside a checkpoint (no ``..``, not absolute)."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


class CheckpointStorage(ABC):
    """Checkpoints as files under their uuid. Every method is blocking (run it in a thread
    from async code) and raises :class:`StorageError` for a failure of the storage itself."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the checkpoints are, for messages (``/mnt/ckpt``, ``s3://bucket/prefix``)."""

    def local_root(self) -> Path | None:
        """The directory holding ``<uuid>/`` when the storage is a mounted file system."""
        return None

    @abstractmethod
    def files(self, uuid: str) -> dict[str, int]:
        """The checkpoint's files as ``{relative path: bytes}``, sorted (empty: no such one)."""

    @abstractmethod
    def upload(self, source: Path, uuid: str, names: Iterable[str]) -> None:
        """Stores ``source/<name>`` as the checkpoint's file ``name``, for each of ``names``."""

    @abstractmethod
    def put_bytes(self, uuid: str, name: str, data: bytes) -> None:
        """Stores ``data`` as the checkpoint's file ``name``."""

    @abstractmethod
    def read_bytes(self, uuid: str, name: str) -> bytes:
        """The contents of the checkpoint's file ``name``.

        Raises:
            FileNotFoundError: no such file.
        """

    @abstractmethod
    def open(self, uuid: str, name: str) -> BinaryIO:
        """The checkpoint's file ``name`` opened for reading (close it).

        Raises:
            FileNotFoundError: no such file.
        """

    @abstractmethod
    def download(self, uuid: str, target: Path, names: Iterable[str]) -> None:
        """Copies the checkpoint's files ``names`` into ``target``, keeping their layout."""

    @abstractmethod
    def delete(self, uuid: str, names: Iterable[str] | None = None) -> bool:
        """Removes the checkpoint (or only its files ``names``).

        Returns:
            Whether anything was there to remove.
        """

    @abstractmethod
    def uuids(self) -> list[str]:
        """Every checkpoint uuid in the storage (complete or not)."""

    def owned(self, uuid: str) -> bool:
        """Whether ``uuid`` is a checkpoint cairn wrote: its marker is there and names it.

        Raises:
            StorageError: the storage could not be read.
        """
        if not safe_uuid(uuid):
            return False
        try:
            with self.open(uuid, MARKER_FILE) as body:
                data = body.read(MAX_MARKER_BYTES + 1)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        return len(data) <= MAX_MARKER_BYTES and is_marker_of(data, uuid)
