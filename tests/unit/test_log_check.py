"""The log invariant checker finds each kind of broken invariant, and nothing in a clean log."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from events.domain.check import check_events
from events.domain.types import (
    CheckpointSaved,
    CustomSearcherAnswered,
    CustomSearcherFailed,
    ExperimentStateChanged,
    ExperimentSubmitted,
    SlotsAllocated,
    SlotsReleased,
    TaskAllocated,
    TaskExited,
    TrialExited,
    TrialStarted,
    TrialStateChanged,
)
from events.log.envelope import Event, Metadata, RecordedEvent
from events.log.registry import encode

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class Log:
    """Builds a log in memory: positions and stream versions assigned as the store would."""

    def __init__(self) -> None:
        self.events: list[RecordedEvent] = []
        self.versions: dict[str, int] = {}

    def add(self, stream_id: str, event: Event, *, version: int | None = None) -> RecordedEvent:
        """Appends ``event`` to ``stream_id`` (at ``version`` if given, to fake a gap)."""
        if version is None:
            version = self.versions.get(stream_id, 0) + 1
        self.versions[stream_id] = version
        recorded = RecordedEvent(
            position=len(self.events) + 1,
            stream_id=stream_id,
            stream_version=version,
            event_id=uuid.uuid4(),
            type=event.event_type,
            schema_version=event.schema_version,
            payload=encode(event),
            metadata=Metadata(),
            recorded_at=NOW,
        )
        self.events.append(recorded)
        return recorded


def allocated(trial: int, allocation: str, slot: str = "s0") -> SlotsAllocated:
    return SlotsAllocated(trial_id=trial, allocation_id=allocation, placements={"a1": [slot]})


def exited(trial: int, allocation: str) -> TrialExited:
    return TrialExited(trial_id=trial, run_id=1, allocation_id=allocation, outcome="completed")


def clean_log() -> Log:
    log = Log()
    log.add("experiment-1", ExperimentSubmitted(experiment_id=1, config={}))
    log.add("trial-11", allocated(11, "11.1"))
    started = TrialStarted(trial_id=11, allocation_id="11.1", run_id=1, agent_id="a1")
    log.add("trial-11", started)
    log.add("trial-11", exited(11, "11.1"))
    log.add("trial-11", TrialStateChanged(trial_id=11, state="COMPLETED"))
    log.add("trial-12", allocated(12, "12.1"))  # the same slot, free again
    log.add("trial-12", exited(12, "12.1"))
    log.add("trial-12", TrialStateChanged(trial_id=12, state="ACTIVE", reason="requeue"))
    log.add("trial-12", allocated(12, "12.2"))
    log.add("trial-12", SlotsReleased(trial_id=12, allocation_id="12.2", placements={}))
    log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="STOPPING_COMPLETED"))
    log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="COMPLETED"))
    return log


def kinds(log: Log) -> list[str]:
    return [f.kind for f in check_events(log.events)]


def test_clean_log_has_no_findings() -> None:
    """A log of normal runs (reuse of a freed slot, a requeue) passes every invariant."""
    assert kinds(clean_log()) == []


def test_allocation_appended_twice_is_found() -> None:
    """The same allocation decided twice shows as allocated-twice, a slot held twice and an overlap."""
    log = Log()
    log.add("trial-11", allocated(11, "11.1", "s0"))
    log.add("trial-11", allocated(11, "11.1", "s1"))
    assert sorted(kinds(log)) == ["allocated-twice", "trial-overlap"]
    log.add("trial-12", allocated(12, "12.1", "s1"))
    assert kinds(log)[-1] == "slot-held-twice"


def test_duplicate_state_change_is_found() -> None:
    """A trial completed twice is a duplicate state change; completing a canceled one is illegal."""
    log = Log()
    log.add("trial-11", TrialStateChanged(trial_id=11, state="COMPLETED"))
    log.add("trial-11", TrialStateChanged(trial_id=11, state="COMPLETED"))
    log.add("trial-12", TrialStateChanged(trial_id=12, state="CANCELED"))
    log.add("trial-12", TrialStateChanged(trial_id=12, state="ERROR"))
    assert kinds(log) == ["duplicate-state", "illegal-transition"]


def test_started_twice_gap_and_duplicate_id_are_found() -> None:
    """A run started twice, a skipped stream version and a repeated event id are each found."""
    log = Log()
    started = TrialStarted(trial_id=11, allocation_id="11.1", run_id=1, agent_id="a1")
    log.add("trial-11", started)
    log.add("trial-11", started)
    log.add("trial-11", exited(11, "11.1"), version=5)
    copy = log.events[2].model_copy(
        update={"position": 4, "stream_id": "trial-99", "stream_version": 1}
    )
    log.events.append(copy)
    assert kinds(log) == ["started-twice", "stream-gap", "duplicate-event-id"]


def test_checkpoint_recorded_by_a_second_trial_is_found() -> None:
    """A uuid saved by one trial and claimed by another (or recorded twice) is a finding."""
    log = Log()
    saved = CheckpointSaved(trial_id=11, run_id=1, uuid="c1", steps_completed=5)
    log.add("trial-11", saved)
    log.add("trial-11", saved.model_copy(update={"uuid": "c2"}))
    assert kinds(log) == []
    log.add("trial-21", saved.model_copy(update={"trial_id": 21}))
    assert kinds(log) == ["checkpoint-claimed-twice"]


def test_custom_searcher_call_settled_twice_or_skipped_is_found() -> None:
    """A custom searcher's calls settle once each, in order: a second answer to a call and an
    answer past an unsettled one are each a finding; other experiments count on their own."""
    log = Log()
    for call in (1, 2):
        log.add("experiment-1", CustomSearcherAnswered(experiment_id=1, call=call, hook="h"))
    log.add("experiment-2", CustomSearcherAnswered(experiment_id=2, call=1, hook="h"))
    assert kinds(log) == []
    failed = CustomSearcherFailed(experiment_id=1, call=2, hook="h", reason="took too long")
    log.add("experiment-1", failed)
    log.add("experiment-1", CustomSearcherAnswered(experiment_id=1, call=4, hook="h"))
    assert kinds(log) == ["custom-call-settled-twice", "custom-call-skipped"]


def test_undecodable_event_is_found() -> None:
    """A stored payload that no longer validates is reported, not raised."""
    log = clean_log()
    broken = log.events[1].model_copy(update={"payload": {"trial_id": 11}})
    log.events[1] = broken
    assert "undecodable" in kinds(log)


def test_a_task_and_a_trial_on_one_slot_is_found_and_a_freed_one_is_not() -> None:
    """A trial given the slot a live task holds is slot-held-twice; after the task's exit (or a
    task canceled before it was placed) the slot is free and nothing is found."""
    task = "0123456789abcdef"
    log = Log()
    placed = TaskAllocated(task_id=task, allocation_id=f"task-{task}.1", placements={"a1": ["s0"]})
    log.add(f"task-{task}", placed)
    log.add("trial-11", allocated(11, "11.1"))
    assert kinds(log) == ["slot-held-twice"]
    log = Log()
    log.add(f"task-{task}", placed)
    ended = TaskExited(task_id=task, allocation_id=f"task-{task}.1", outcome="completed")
    log.add(f"task-{task}", ended)
    log.add("task-ffffffffffffffff", TaskExited(task_id="ffffffffffffffff", outcome="canceled"))
    log.add("trial-11", allocated(11, "11.1"))
    assert kinds(log) == []
