"""Experiment and trial state machines: Determined's rules, illegal transitions refused and never applied."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.domain import lifecycle as lc
from events.domain.aggregates import ExperimentView, TrialView, apply_experiment, apply_trial
from events.log.envelope import Metadata, RecordedEvent


def changed(n: int, kind: str, state: str) -> RecordedEvent:
    payload = (
        {"experiment_id": 1, "state": state}
        if kind == "experiment"
        else {"trial_id": 11, "state": state}
    )
    return RecordedEvent(
        position=n,
        stream_id=f"{kind}-1",
        stream_version=n,
        event_id=uuid.uuid4(),
        type="ExperimentStateChanged" if kind == "experiment" else "TrialStateChanged",
        schema_version=1,
        payload=payload,
        metadata=Metadata(),
        recorded_at=datetime.now(UTC),
    )


def test_user_actions_follow_determined_rules() -> None:
    """Pause/activate/cancel/kill are allowed where Determined allows them and refused elsewhere."""
    lc.check_experiment("ACTIVE", "PAUSED")
    lc.check_experiment("PAUSED", "ACTIVE")
    lc.check_experiment("STOPPING_CANCELED", "STOPPING_KILLED")
    lc.check_experiment("STOPPING_KILLED", "CANCELED")
    with pytest.raises(lc.IllegalTransitionError, match="COMPLETED to ACTIVE"):
        lc.check_experiment("COMPLETED", "ACTIVE")
    with pytest.raises(lc.IllegalTransitionError):
        lc.check_experiment("STOPPING_KILLED", "STOPPING_CANCELED")
    with pytest.raises(lc.IllegalTransitionError):
        lc.check_experiment("ACTIVE", "NO_SUCH_STATE")


def test_trial_stopping_states_only_degrade() -> None:
    """A stopping trial may move to a more severe stopping state, never a milder one."""
    lc.check_trial("STOPPING_COMPLETED", "STOPPING_ERROR")
    lc.check_trial("STOPPING_CANCELED", "STOPPING_KILLED")
    with pytest.raises(lc.IllegalTransitionError):
        lc.check_trial("STOPPING_KILLED", "STOPPING_CANCELED")
    lc.check_trial("ACTIVE", "COMPLETED")
    lc.check_trial("COMPLETED", "ACTIVE")


def test_fold_skips_illegal_events() -> None:
    """An illegal state change in the log is refused by the experiment fold and does not change
    it."""
    events = [
        changed(1, "experiment", "PAUSED"),
        changed(2, "experiment", "COMPLETED"),
        changed(3, "experiment", "STOPPING_CANCELED"),
        changed(4, "experiment", "CANCELED"),
    ]
    view = ExperimentView(1)
    applied = [apply_experiment(view, e) for e in events]
    assert view.state == "CANCELED"
    assert applied == [True, False, True, True]


@given(st.lists(st.sampled_from(sorted(lc.STATES)), max_size=30))
def test_folded_trial_never_degrades_backwards(targets: list[str]) -> None:
    """Whatever sequence of trial state changes is logged, a stopping state is never followed by a milder one."""
    view = TrialView(11)
    for n, target in enumerate(targets, 1):
        before = view.state
        apply_trial(view, changed(n, "trial", target))
        if before in lc.STOPPING and view.state in lc.STOPPING:
            assert lc.SEVERITY[view.state] >= lc.SEVERITY[before]
        assert view.state in lc.STATES
