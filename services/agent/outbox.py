"""Exit reports the API has not yet accepted, kept on disk so that no restart of the agent
loses them.

A run's exit is written here before it is sent and removed once the API answered (or refused it
for good). An agent that starts finds the reports a previous process of it could not deliver (the
API was down, or the agent was killed mid-report) and sends them before it registers, so the log
records how those runs really ended rather than only that the agent lost them. Sending twice is
harmless: the API applies an allocation's exit once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("agent")


@dataclass(frozen=True)
class ExitReport:
    """``POST /allocations/{allocation_id}/exited`` as the agent sends it.

    ``agent_shutdown`` is absent from reports kept by older agents; it defaults to False.
    """

    allocation_id: str
    exit_code: int
    message: str
    key: str
    agent_shutdown: bool = False


class UnreportedExits:
    """One JSON file per exit report not yet accepted, under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, allocation_id: str) -> Path:
        digest = hashlib.sha256(allocation_id.encode()).hexdigest()[:24]
        return self._dir / f"{digest}.json"

    def keep(self, report: ExitReport) -> None:
        """Writes ``report`` durably (temporary file, fsync, rename) before it is sent."""
        path = self._path(report.allocation_id)
        part = path.with_suffix(".part")
        with part.open("w") as fh:
            json.dump(asdict(report), fh)
            fh.flush()
            os.fsync(fh.fileno())
        part.replace(path)

    def done(self, allocation_id: str) -> None:
        """Forgets the report of ``allocation_id`` (the API answered it)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(allocation_id).unlink()

    def pending(self) -> list[ExitReport]:
        """Every report kept and not yet done, oldest first; unreadable files are dropped."""
        reports = []
        files = sorted(self._dir.glob("*.json"), key=lambda p: (p.stat().st_mtime, p.name))
        for path in files:
            try:
                reports.append(ExitReport(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError) as exc:
                log.error("unreadable unreported exit dropped", path=str(path), error=str(exc))
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return reports
