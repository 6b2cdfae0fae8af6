"""A directory of small JSON records, one per allocation, that survive a SIGKILL of the agent.

Each record is written durably (temporary file, fsync, rename, fsync of the directory), so after a
crash it is either there whole or not there; a file that cannot be read back is dropped with an
error rather than stopping the agent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog

log = structlog.get_logger("agent")
R = TypeVar("R")


class RecordDirectory:
    """JSON records keyed by allocation id under ``directory``."""

    def __init__(self, directory: Path, what: str) -> None:
        self._dir = directory
        self._what = what
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, allocation_id: str) -> Path:
        digest = hashlib.sha256(allocation_id.encode()).hexdigest()[:24]
        return self._dir / f"{digest}.json"

    def write(self, allocation_id: str, data: dict[str, Any]) -> None:
        """Writes the record of ``allocation_id`` durably, replacing any earlier one."""
        path = self._path(allocation_id)
        part = path.with_suffix(".part")
        with part.open("w") as fh:
            json.dump(data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        part.replace(path)
        fd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, allocation_id: str) -> None:
        """Forgets the record of ``allocation_id`` (nothing if there is none)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(allocation_id).unlink()

    def read_all(self, parse: Callable[[dict[str, Any]], R]) -> list[R]:
        """Every record, oldest first, through ``parse``; unreadable ones are dropped."""
        out: list[R] = []
        files = sorted(self._dir.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))
        for path in files:
            try:
                out.append(parse(json.loads(path.read_text())))
            except (OSError, ValueError, TypeError, KeyError) as exc:
                log.error(f"unreadable {self._what} dropped", path=str(path), error=str(exc))
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return out
