"""The start of each no-op trial, phase by phase, from the log and the agent's own log lines.

A trial's start, as ``bench/trials.py`` breaks it down (each mark is the nearest fact there is):

- ``requested``: ``TrialRequested``'s ``recorded_at`` (the searcher asked for the trial);
- ``allocated``: ``SlotsAllocated``'s ``recorded_at`` (the scheduler placed it);
- ``delivered``: the agent's ``command`` log line for the ``start`` command (no event records
  that the agent received a command: the log says only what the platform decided);
- ``launched``: the agent's ``run launched`` log line (the process exists; ``TrialStarted`` is
  recorded once the agent has told the API, which is kept as ``started``);
- ``first_output``: the ``ts`` of the run's first line in ``task_logs`` (stamped by the agent as
  it reads it: the interpreter is up and the training code imported and running);
- ``first_report``: the first ``WorkloadCompleted``/``ValidationReported``/``CheckpointSaved``
  recorded for the run (the Core API's reporter delivered it);
- ``process_exited``: the agent's ``run exited`` log line;
- ``exited``: ``TrialExited``'s ``recorded_at``; ``released``: ``SlotsReleased``'s.

Phases are the differences of consecutive marks; a mark that is missing (a log line rotated
away) leaves its two phases out for that trial. ``turnaround`` is a slot's idle time between two
trials: the k-th ``SlotsAllocated`` after the first ``slots`` ones against the (k - slots)-th
``SlotsReleased``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from events.log.envelope import RecordedEvent

REPORT_TYPES = ("WorkloadCompleted", "ValidationReported", "CheckpointSaved")
AGENT_MARKS = {"command": "delivered", "run launched": "launched", "run exited": "process_exited"}
"""The agent's log events that mark a phase, by the mark they set."""

MARKS = (
    "requested",
    "allocated",
    "delivered",
    "launched",
    "first_output",
    "first_report",
    "process_exited",
    "exited",
)
PHASES: tuple[tuple[str, str, str, str], ...] = (
    ("requested", "allocated", "requested -> allocated", "queue for a slot + scheduler"),
    ("allocated", "delivered", "allocated -> command delivered", "NATS command to the agent"),
    ("delivered", "launched", "delivered -> process started", "spec, code, confinement, exec"),
    ("launched", "first_output", "process started -> first output", "interpreter, imports"),
    ("first_output", "first_report", "first output -> first report", "training, report POST"),
    ("first_report", "process_exited", "first report -> process exit", "close, exit"),
    ("process_exited", "exited", "process exit -> TrialExited", "exit report to the API"),
)


@dataclass
class TrialMarks:
    """The times of one trial's start marks (see the module docstring); ``None`` when missing."""

    trial_id: int
    allocation_id: str = ""
    times: dict[str, datetime] = field(default_factory=dict)
    released: datetime | None = None

    def phase(self, start: str, end: str) -> float | None:
        """Seconds from mark ``start`` to mark ``end`` (``None`` if either is missing)."""
        a, b = self.times.get(start), self.times.get(end)
        return None if a is None or b is None else (b - a).total_seconds()


def marks_from_events(
    trial_id: int, requested: datetime, events: Iterable[RecordedEvent]
) -> TrialMarks:
    """The log's marks of one trial (its first run) from its stream's events."""
    marks = TrialMarks(trial_id, times={"requested": requested})
    for event in events:
        kind, payload, at = event.type, event.payload, event.recorded_at
        if kind == "SlotsAllocated" and "allocated" not in marks.times:
            marks.allocation_id = str(payload["allocation_id"])
            marks.times["allocated"] = at
        elif kind in REPORT_TYPES and "first_report" not in marks.times:
            marks.times["first_report"] = at
        elif kind == "TrialExited" and "exited" not in marks.times:
            marks.times["exited"] = at
        elif kind == "SlotsReleased" and marks.released is None:
            marks.released = at
    return marks


def agent_marks(lines: Iterable[str]) -> dict[str, dict[str, datetime]]:
    """The agent's marks by allocation id, from its JSON log lines (others are skipped)."""
    out: dict[str, dict[str, datetime]] = {}
    for text in lines:
        if not text.startswith("{"):
            continue
        try:
            record: dict[str, Any] = json.loads(text)
        except ValueError:
            continue
        mark = AGENT_MARKS.get(str(record.get("event")))
        allocation_id = record.get("allocation_id")
        if mark is None or not allocation_id or "timestamp" not in record:
            continue
        if mark == "delivered" and record.get("kind") != "start":
            continue
        stamp = datetime.fromisoformat(str(record["timestamp"]).replace("Z", "+00:00"))
        out.setdefault(str(allocation_id), {}).setdefault(mark, stamp)
    return out


def read_agent_marks(log_file: Path) -> dict[str, dict[str, datetime]]:
    """:func:`agent_marks` of an agent's log file (empty if it is missing)."""
    try:
        return agent_marks(log_file.read_text(errors="replace").splitlines())
    except OSError:
        return {}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, linearly interpolated."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def turnarounds(trials: Sequence[TrialMarks], slots: int) -> list[float]:
    """A slot's idle seconds between trials: the k-th allocation against the (k - slots)-th
    release, for every allocation after the first ``slots`` (single-slot trials)."""
    allocated = sorted(t.times["allocated"] for t in trials if "allocated" in t.times)
    released = sorted(t.released for t in trials if t.released is not None)
    return [
        (allocated[k] - released[k - slots]).total_seconds()
        for k in range(slots, len(allocated))
        if k - slots < len(released)
    ]


@dataclass(frozen=True)
class PhaseStats:
    """Median, 90th percentile and count of one phase, in seconds."""

    name: str
    what: str
    median: float
    p90: float
    count: int

    def to_json(self) -> dict[str, Any]:
        """The figures as JSON (milliseconds, rounded)."""
        return {
            "phase": self.name,
            "what": self.what,
            "median_ms": round(self.median * 1000, 1),
            "p90_ms": round(self.p90 * 1000, 1),
            "trials": self.count,
        }


def breakdown(trials: Sequence[TrialMarks], slots: int) -> list[PhaseStats]:
    """Median and p90 of every phase over ``trials``, then the slot turnaround and the slot's
    whole occupation (allocated -> TrialExited)."""
    rows: list[tuple[str, str, list[float]]] = []
    for start, end, name, what in PHASES:
        values = [v for t in trials if (v := t.phase(start, end)) is not None]
        rows.append((name, what, values))
    rows.append(
        (
            "allocated -> TrialExited",
            "a slot's occupation by one trial",
            [v for t in trials if (v := t.phase("allocated", "exited")) is not None],
        )
    )
    rows.append(("SlotsReleased -> next allocated", "a slot idle", turnarounds(trials, slots)))
    return [
        PhaseStats(name, what, statistics.median(vs), percentile(vs, 0.9), len(vs))
        for name, what, vs in rows
        if vs
    ]


def missing_marks(trials: Sequence[TrialMarks]) -> list[str]:
    """The marks absent from at least one trial (named with how many trials lack them)."""
    out = []
    for mark in MARKS:
        lacking = sum(1 for t in trials if mark not in t.times)
        if lacking:
            out.append(f"{mark} ({lacking} of {len(trials)})")
    return out


def cpu_seconds(pids: Mapping[str, int], *, split: str = "") -> dict[str, float]:
    """CPU seconds (user + system) each named process and its descendants have used so far.

    A process's descendants count twice over: the live ones by their own times, the ones it has
    reaped by its children's times. The descendants of the process named ``split`` (the agent:
    its trials) are counted apart, under ``"<split> children"``. A process that is gone counts 0.
    """
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            proc = psutil.Process(pid)
            times = proc.cpu_times()
            descendants = times.children_user + times.children_system
            for child in proc.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child_times = child.cpu_times()
                    descendants += child_times.user + child_times.system
        except psutil.Error:
            out[name] = 0.0
            continue
        own = times.user + times.system
        if name == split:
            out[name] = own
            out[f"{name} children"] = descendants
        else:
            out[name] = own + descendants
    return out


def cpu_used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds used by each process between two :func:`cpu_seconds` snapshots."""
    return {name: max(0.0, after[name] - before.get(name, 0.0)) for name in after}
