"""The no-op trial bench's start breakdown: marks from the log and the agent's lines, phases."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bench._trial_start import (
    TrialMarks,
    agent_marks,
    breakdown,
    marks_from_events,
    missing_marks,
    percentile,
    turnarounds,
)
from events.log.envelope import RecordedEvent

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(ms: float) -> datetime:
    """``T0`` plus ``ms`` milliseconds."""
    return T0 + timedelta(milliseconds=ms)


def recorded(kind: str, ms: float, **payload: Any) -> RecordedEvent:
    """A stored event of ``kind`` recorded ``ms`` after ``T0``."""
    return RecordedEvent.model_validate(
        {
            "position": 1,
            "stream_id": "trial-1",
            "stream_version": 1,
            "event_id": uuid.uuid4(),
            "type": kind,
            "schema_version": 1,
            "payload": payload,
            "metadata": {},
            "recorded_at": at(ms),
        }
    )


def agent_line(event: str, ms: float, **fields: Any) -> str:
    """One JSON log line of the agent."""
    stamp = at(ms).isoformat().replace("+00:00", "Z")
    return json.dumps({**fields, "event": event, "timestamp": stamp})


def test_marks_come_from_the_trials_first_run() -> None:
    """The allocation, first report and exit are each the first of their kind in the stream."""
    events = [
        recorded("SlotsAllocated", 10, allocation_id="1.1"),
        recorded("TrialStarted", 40),
        recorded("ValidationReported", 300),
        recorded("WorkloadCompleted", 310),
        recorded("TrialExited", 400),
        recorded("SlotsReleased", 410),
        recorded("SlotsAllocated", 500, allocation_id="1.2"),
    ]
    marks = marks_from_events(1, at(0), events)
    assert marks.allocation_id == "1.1"
    assert marks.times == {
        "requested": at(0),
        "allocated": at(10),
        "first_report": at(300),
        "exited": at(400),
    }
    assert marks.released == at(410)


def test_agent_marks_read_start_commands_launches_and_exits() -> None:
    """Only a ``start`` command marks delivery; lines that are not JSON are skipped."""
    lines = [
        "not json",
        agent_line("command", 5, kind="kill", allocation_id="1.1"),
        agent_line("command", 20, kind="start", allocation_id="1.1"),
        agent_line("run launched", 50, allocation_id="1.1"),
        agent_line("run exited", 350, allocation_id="1.1"),
        agent_line("heartbeat", 60),
    ]
    assert agent_marks(lines) == {
        "1.1": {"delivered": at(20), "launched": at(50), "process_exited": at(350)}
    }


def test_breakdown_gives_median_and_p90_of_each_phase() -> None:
    """Phases are differences of consecutive marks; a missing mark leaves its phases out."""
    trials = []
    for i in range(10):
        marks = TrialMarks(i, f"{i}.1")
        marks.times = {"requested": at(0), "allocated": at(10 + i), "delivered": at(30 + i)}
        trials.append(marks)
    trials[0].times.pop("delivered")
    phases = {p.name: p for p in breakdown(trials, 2)}
    assert phases["requested -> allocated"].count == 10
    assert phases["requested -> allocated"].median == pytest.approx(0.0145)
    assert phases["allocated -> command delivered"].count == 9
    assert phases["allocated -> command delivered"].p90 == pytest.approx(0.02)
    assert "delivered -> process started" not in phases
    assert missing_marks(trials[:2]) == [
        "delivered (1 of 2)",
        "launched (2 of 2)",
        "first_output (2 of 2)",
        "first_report (2 of 2)",
        "process_exited (2 of 2)",
        "exited (2 of 2)",
    ]


def test_turnaround_pairs_each_allocation_with_an_earlier_release() -> None:
    """With 2 slots the third allocation follows the first release, the fourth the second."""
    trials = []
    for i, (allocated, released) in enumerate([(0, 100), (0, 120), (130, 300), (150, 320)]):
        marks = TrialMarks(i, times={"allocated": at(allocated)}, released=at(released))
        trials.append(marks)
    assert turnarounds(trials, 2) == pytest.approx([0.03, 0.03])


def test_percentile_interpolates() -> None:
    """The p90 of 0..10 is 9; of one value, that value."""
    assert percentile([float(v) for v in range(11)], 0.9) == 9.0
    assert percentile([4.0], 0.9) == 4.0
