"""TensorBoard event files without TensorFlow, and their upload to the trial's storage.

An event file is a sequence of TFRecords, each ``<len: u64><masked crc32c of len: u32><data>
<masked crc32c of data: u32>`` (little-endian), whose data is one serialised ``tensorboard.Event``
protobuf. Only the few fields scalars need are written, encoded by hand:

- ``Event``: ``wall_time`` (1, double), ``step`` (2, int64), ``file_version`` (3, string),
  ``summary`` (5, message);
- ``Summary``: repeated ``value`` (1, message);
- ``Summary.Value``: ``tag`` (1, string), ``simple_value`` (2, float).

:class:`TensorboardManager` copies what changed under a trial's local TensorBoard directory into
``<storage root>/tensorboard/experiment/<experiment id>/trial/<trial id>/`` (in an S3 storage:
the objects of that path under its prefix).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

log = logging.getLogger("cairn.core")

FILE_VERSION = "brain.Event:2"
_MASK_DELTA = 0xA282EAD8


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """The CRC-32C (Castagnoli) checksum of ``data``."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The TFRecord checksum: CRC-32C rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 is sent as its two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field_bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def encode_event(
    wall_time: float,
    step: int = 0,
    *,
    scalars: Mapping[str, float] | None = None,
    file_version: str | None = None,
) -> bytes:
    """One serialised ``Event`` carrying ``file_version`` or a summary of scalar values."""
    out = bytearray(_varint(1 << 3 | 1) + struct.pack("<d", wall_time))
    if step:
        out += _varint(2 << 3 | 0) + _varint(int(step))
    if file_version is not None:
        out += _field_bytes(3, file_version.encode())
    if scalars:
        summary = b"".join(
            _field_bytes(
                1,
                _field_bytes(1, tag.encode()) + _varint(2 << 3 | 5) + struct.pack("<f", value),
            )
            for tag, value in scalars.items()
        )
        out += _field_bytes(5, summary)
    return bytes(out)


class EventFileWriter:
    """Appends scalar summaries to one ``events.out.tfevents.*`` file under ``logdir``.

    Every write is flushed, so a crash loses at most the record being written.

    Args:
        logdir: the directory (created if missing).
        suffix: appended to the file name (e.g. a rank), keeping names unique per process.
    """

    def __init__(self, logdir: str | os.PathLike[str], suffix: str = "") -> None:
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
        self.path = self.logdir / (name + suffix)
        self._lock = threading.Lock()
        self._file = self.path.open("ab")
        self._write(encode_event(time.time(), file_version=FILE_VERSION))

    def _write(self, event: bytes) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write(tfrecord(event))
            self._file.flush()

    def add_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Writes one event with every ``tag -> value`` of ``scalars`` at ``step``."""
        if scalars:
            self._write(encode_event(time.time(), step, scalars=scalars))

    def close(self) -> None:
        """Closes the file (later writes are dropped)."""
        with self._lock:
            self._file.close()


Selector = Callable[[Path], bool]
Mangler = Callable[[Path, int], Path]
Put = Callable[[Path, Path], None]
"""Stores a local file (first argument) at a storage path (second) in remote storage."""


def _keep_all(_: Path) -> bool:
    return True


def _same_name(path: Path, _rank: int) -> Path:
    return path


class TensorboardManager:
    """Uploads new and changed files of the local TensorBoard directory to storage.

    Args:
        base_path: the local directory training code writes into (``get_tensorboard_path()``).
        storage_path: where the files are copied to, or ``None`` to upload nothing.
        rank: this process's rank (passed to the mangler).
        put: stores each file in remote storage (an S3 bucket) at ``storage_path / name``
            instead of copying it there on a file system.
    """

    def __init__(
        self, base_path: Path, storage_path: Path | None, rank: int, *, put: Put | None = None
    ) -> None:
        self.base_path = base_path
        self.storage_path = storage_path
        self.rank = rank
        self._put = put
        self._synced: dict[Path, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def sync(self, selector: Selector | None = None, mangler: Mangler | None = None) -> list[Path]:
        """Copies every file under :attr:`base_path` that is new or changed since the last sync
        and that ``selector`` accepts (given the path relative to :attr:`base_path`), to
        ``storage_path / mangler(relative path, rank)``. Each file is written to a temporary name
        and renamed, so a reader never sees half a file.

        Returns:
            The storage paths written.
        """
        if self.storage_path is None or not self.base_path.is_dir():
            return []
        keep = selector or _keep_all
        rename = mangler or _same_name
        written: list[Path] = []
        with self._lock:
            for dirpath, _, files in os.walk(self.base_path):
                for name in sorted(files):
                    source = Path(dirpath) / name
                    relative = source.relative_to(self.base_path)
                    try:
                        stat = source.stat()
                    except OSError:
                        continue
                    stamp = (stat.st_mtime_ns, stat.st_size)
                    if self._synced.get(relative) == stamp or not keep(relative):
                        continue
                    target = self.storage_path / rename(relative, self.rank)
                    if self._put is not None:
                        self._put(source, target)  # an object appears whole when written
                    else:
                        target.parent.mkdir(parents=True, exist_ok=True)
                        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
                        shutil.copy2(source, partial)
                        os.replace(partial, target)
                    self._synced[relative] = stamp
                    written.append(target)
        return written
