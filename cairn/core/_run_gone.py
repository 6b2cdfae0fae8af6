"""What a training process does once its run is no longer its trial's current run.

The platform declares a run lost when its agent restarted or went silent, and runs the trial
again from its latest checkpoint. The old run's process may still be alive (nobody stopped it if
its agent was SIGKILLed), but nothing it reports is accepted any more (HTTP 409 with reason
``run_not_current``) and every checkpoint it writes belongs to no one. So it stops at once: the
thread that learns it (the report sender, or the preemption watcher told ``current: false``) logs
one clear line and ends the process with :data:`EXIT_RUN_GONE`. What it spawned is left to the
agent, which stops a run's whole process group once its leader exits (or, if it was restarted,
every group the earlier agent process left behind).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable

from cairn.core._http import HTTPStatusError

log = logging.getLogger("cairn.core")

EXIT_RUN_GONE = 75
"""The exit status of a process stopped because its run is no longer current."""

RUN_NOT_CURRENT = "run_not_current"
"""The ``reason`` the API gives when it refuses a report from a run that may no longer report."""

RunGoneHandler = Callable[[str], None]
"""Called (from a background thread) with the API's explanation once the run is gone."""

_stopping = threading.Lock()


def is_run_gone(exc: HTTPStatusError) -> bool:
    """True if ``exc`` refuses a report (409) or the run's token (403) because its run is not
    (or no longer) current."""
    if exc.status not in (403, 409):
        return False
    try:
        body = json.loads(exc.body)
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("reason") == RUN_NOT_CURRENT


def error_message(exc: HTTPStatusError) -> str:
    """The API's message in ``exc`` (the raw body when it is not the usual error document)."""
    try:
        body = json.loads(exc.body)
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return exc.body[:200]


def exit_run_gone(reason: str) -> None:
    """Logs why and ends this process at once.

    Args:
        reason: what the API said about the run.
    """
    if not _stopping.acquire(blocking=False):
        return  # another thread is already ending the process
    message = (
        f"cairn: this run is no longer its trial's current run ({reason}); "
        "stopping the training process: nothing it reports would be recorded"
    )
    log.error(message)
    try:
        sys.stdout.flush()
        print(message, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    os._exit(EXIT_RUN_GONE)
