"""The unmanaged-run decider (:mod:`events.domain.unmanaged`) over folded trial streams, and the
scheduler and searcher leaving unmanaged experiments alone; no HTTP, no database."""

from __future__ import annotations

from collections.abc import Sequence

from events.domain import lifecycle
from events.domain.aggregates import TrialView, fold_trial
from events.domain.types import (
    CheckpointSaved,
    ExperimentSubmitted,
    SlotsAllocated,
    TrialExited,
    TrialStarted,
    TrialStateChanged,
)
from events.domain.unmanaged import close_run, expire_run, live_run, open_run, request_trial
from events.log.envelope import Event
from services.scheduler.state import ClusterState
from tests.unit.test_aggregates import stored

TRIAL = 18


def folded(events: Sequence[Event]) -> TrialView:
    """The trial's stream after ``events``, as the gateway folds it."""
    recorded = [
        stored(e.event_type, e.schema_version, e.model_dump(mode="json"), i)
        for i, e in enumerate(events, 1)
    ]
    view = fold_trial(TRIAL, recorded)
    view.version = len(recorded)
    return view


def test_first_run_opens_run_one_holding_no_slots_and_started() -> None:
    """A new trial's first run is run 1: SlotsAllocated with no placements, then TrialStarted."""
    events, run_id = open_run(TrialView(TRIAL))
    assert run_id == 1
    assert [type(e) for e in events] == [SlotsAllocated, TrialStarted]
    allocated = events[0]
    assert isinstance(allocated, SlotsAllocated)
    assert allocated.placements == {} and allocated.allocation_id == f"{TRIAL}.1"


def test_closing_completes_once_and_a_second_run_resumes_from_the_latest_checkpoint() -> None:
    """Close ends run 1 COMPLETED (a repeat decides nothing); run 2 makes the trial ACTIVE again
    and names the latest checkpoint it restores."""
    opened, _ = open_run(TrialView(TRIAL))
    checkpoint = CheckpointSaved(trial_id=TRIAL, run_id=1, uuid="c-1", steps_completed=5)
    history = [*opened, checkpoint]
    closed = close_run(folded(history), 1, failed=False)
    assert isinstance(closed[0], TrialExited) and closed[0].outcome == "completed"
    assert isinstance(closed[-1], TrialStateChanged) and closed[-1].state == lifecycle.COMPLETED
    history += closed
    trial = folded(history)
    assert trial.state == lifecycle.COMPLETED and live_run(trial) is None
    assert close_run(trial, 1, failed=False) == []
    reopened, run_id = open_run(trial)
    assert run_id == 2
    assert isinstance(reopened[0], TrialStateChanged) and reopened[0].state == lifecycle.ACTIVE
    started = reopened[-1]
    assert isinstance(started, TrialStarted) and started.restored_checkpoint == "c-1"
    assert folded(history + reopened).state == lifecycle.ACTIVE


def test_a_failed_close_and_a_silent_run_end_the_trial_errored() -> None:
    """A failed close is outcome failed and ERROR; a silent run expires lost and ERROR, once."""
    opened, _ = open_run(TrialView(TRIAL))
    failed = close_run(folded(opened), 1, failed=True, message="boom", exit_code=1)
    assert isinstance(failed[0], TrialExited) and failed[0].outcome == "failed"
    assert folded([*opened, *failed]).state == lifecycle.ERROR
    expired = expire_run(folded(opened), 1, silent_seconds=12.0)
    assert isinstance(expired[0], TrialExited) and expired[0].outcome == "lost"
    assert "12s" in expired[0].message
    after = folded([*opened, *expired])
    assert after.state == lifecycle.ERROR
    assert expire_run(after, 1, silent_seconds=30.0) == []
    assert close_run(after, 1, failed=False) == []


def test_a_new_run_supersedes_a_run_still_open() -> None:
    """Opening run 2 while run 1 is open ends run 1 lost first, so one run is live at a time."""
    opened, _ = open_run(TrialView(TRIAL))
    events, run_id = open_run(folded(opened))
    assert run_id == 2
    assert isinstance(events[0], TrialExited) and events[0].run_id == 1
    assert events[0].outcome == "lost"
    assert live_run(folded([*opened, *events])) == 2
    assert close_run(folded([*opened, *events]), 1, failed=False) == []


def test_the_scheduler_never_folds_an_unmanaged_experiment_or_its_trials() -> None:
    """ExperimentSubmitted{unmanaged} and its trials stay out of the scheduler's state."""
    state = ClusterState()
    submitted = ExperimentSubmitted(
        experiment_id=8, config={}, owner="alice", unmanaged=True, external_id="e"
    )
    requested = request_trial(
        experiment_id=8, trial_id=TRIAL, seq=1, external_id="t", hparams={"lr": 0.1}
    )
    opened, _ = open_run(TrialView(TRIAL))
    for i, event in enumerate([submitted, requested, *opened], 1):
        state.apply(stored(event.event_type, event.schema_version, event.model_dump(), i))
    assert state.experiments == {} and state.trials == {}
