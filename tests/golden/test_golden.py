"""Golden histories replay through today's folds to the final state recorded with them."""

from __future__ import annotations

import json

import pytest

from events.log.store import EventStore
from tests.golden import history


@pytest.mark.parametrize("name", history.NAMES)
async def test_history_replays_to_its_recorded_state(store: EventStore, name: str) -> None:
    """A log recorded from a real run, put into a fresh database, folds (lifecycles, scheduler,
    searcher, tracker projections, log checker) to exactly the state recorded with it."""
    rows = history.load(name)
    recorded = json.loads(history.state_path(name).read_text())
    await history.insert(store, rows)
    state = await history.final_state(store)
    for part in ("lifecycle", "scheduler", "searcher", "tracker", "check_log", "events"):
        assert state[part] == recorded[part], f"{name}: replay of the {part} changed"
    assert state["check_log"] == []


@pytest.mark.parametrize("name", history.NAMES)
def test_searcher_replay_decides_what_the_log_records(name: str) -> None:
    """The searcher's methods, fed the history afresh, decide the very trial requests (ids,
    hyperparameters, seeds) and stops that the log recorded, in the same order."""
    events = history.decoded(history.load(name))
    derived = history.searcher_decisions(events)["decisions"]
    assert [d for d in derived if "fact" not in d] == history.logged_decisions(events)


@pytest.mark.parametrize("name", history.NAMES)
def test_history_is_what_its_name_says(name: str) -> None:
    """Each history holds the behaviour it was recorded for (so a re-recording that lost it,
    e.g. a crash that no longer restarts, cannot pass unnoticed)."""
    events = history.decoded(history.load(name))
    types = [e.type for e in events]
    exits = [e.payload["outcome"] for e in events if e.type == "TrialExited"]
    ended = [
        e.payload["state"]
        for e in events
        if e.type == "ExperimentStateChanged" and e.payload["state"] in ("COMPLETED", "CANCELED")
    ]
    if name == "asha":
        assert types.count("TrialRequested") == 16 and "TrialStopRequested" in types
        assert ended == ["COMPLETED"]
    elif name == "crash_resume":
        assert exits == ["failed", "completed"] and "TrialRestarted" in types
        assert ended == ["COMPLETED"]
    elif name == "preemption":
        assert types.count("PreemptionRequested") == 1 and "preempted" in exits
        assert ended == ["COMPLETED", "COMPLETED"]
    elif name == "kill":
        assert exits == ["killed"] and ended == ["CANCELED"]
