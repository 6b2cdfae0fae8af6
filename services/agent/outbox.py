"""Exit reports the API has not yet accepted, kept on disk so that no restart of the agent
loses them.

A run's exit is written here before it is sent and removed once the API answered (or refused it
for good). An agent that starts finds the reports a previous process of it could not deliver (the
API was down, or the agent was killed mid-report) and sends them before it registers, so the log
records how those runs really ended rather than only that the agent lost them. Sending twice is
harmless: the API applies an allocation's exit once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from services.agent.records import RecordDirectory


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
    """One record per exit report not yet accepted, under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._records = RecordDirectory(directory, "unreported exit")

    def keep(self, report: ExitReport) -> None:
        """Writes ``report`` durably before it is sent."""
        self._records.write(report.allocation_id, asdict(report))

    def done(self, allocation_id: str) -> None:
        """Forgets the report of ``allocation_id`` (the API answered it)."""
        self._records.remove(allocation_id)

    def pending(self) -> list[ExitReport]:
        """Every report kept and not yet done, oldest first; unreadable files are dropped."""
        return self._records.read_all(lambda raw: ExitReport(**raw))
