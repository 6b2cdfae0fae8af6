"""The embedded cluster's logs: where they go, how the supervisor writes its own, how an error
quotes one.

Every service and the supervisor log to ``DIR/logs/<name>.log``; the supervisor's own log
(``supervisor.log``) is JSON lines, one per event, and is where restarts and failures are reported.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TextIO

import structlog


def logs_dir(data_dir: Path) -> Path:
    """Where service and supervisor logs go."""
    return data_dir / "logs"


def supervisor_log(data_dir: Path) -> Path:
    """The supervisor's own log (restarts and failures are reported here)."""
    return logs_dir(data_dir) / "supervisor.log"


def tail(path: Path | str, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" if it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def indent(text: str) -> str:
    """``text`` indented by four spaces for quoting in an error (``(empty log)`` if empty)."""
    return "\n".join(f"    {line}" for line in text.splitlines()) or "    (empty log)"


def configure_logging(stream: TextIO) -> None:
    """Logs the supervisor's structlog events as JSON lines to ``stream``."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )
