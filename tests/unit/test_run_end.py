"""One end per run: which of an agent's exit report and a ``lost`` verdict is a run's end, and
why a leaving agent takes no new work (pure: the scheduler's fold and planner, the agent fold)."""

from __future__ import annotations

from events.domain.aggregates import fold_agent
from events.domain.names import trial_stream
from events.domain.types import (
    AgentLeaving,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialStateChanged,
)
from events.log.envelope import Event
from tests.unit.test_planner import experiment, types
from tests.unit.test_reconcile import Log, beat, register, step, two_running_trials


def report(log: Log, allocation_id: str, outcome: str, exit_code: int) -> None:
    """The agent's exit report as the API records it (TrialExited + SlotsReleased)."""
    trial_id, run_id = (int(part) for part in allocation_id.split("."))
    placements = log.state.trials[trial_id].run.placements  # type: ignore[union-attr]
    stream = trial_stream(trial_id)
    log.add(
        stream,
        TrialExited(
            trial_id=trial_id,
            run_id=run_id,
            allocation_id=allocation_id,
            outcome=outcome,  # type: ignore[arg-type]
            exit_code=exit_code,
            message="stopped by the agent's shutdown" if outcome == "lost" else "",
        ),
    )
    log.add(
        stream,
        SlotsReleased(trial_id=trial_id, allocation_id=allocation_id, placements=placements),
    )


def exits(log: Log) -> list[tuple[str, str, int | None]]:
    """Every TrialExited in the log: (allocation id, outcome, exit code)."""
    found = []
    for recorded in log.events:
        event = recorded.decode()
        if isinstance(event, TrialExited):
            found.append((event.allocation_id, event.outcome, event.exit_code))
    return found


def settle(log: Log, incarnation: str) -> list[Event]:
    """Plans until nothing more is decided, the agent's heartbeats listing nothing."""
    made: list[Event] = []
    for seq in range(1, 20):
        decided = step(log, beat(incarnation, seq))
        if not decided:
            return made
        made += decided
    raise AssertionError("planner did not settle")


def test_reports_delivered_before_the_new_registration_are_the_runs_ends() -> None:
    """A restarted agent delivers its kept reports, then registers anew: the reports are the
    runs' ends (no 'agent restarted' verdict), the shutdown's ``lost`` restarts uncounted."""
    log = two_running_trials()
    report(log, "11.1", "lost", 143)  # stopped by the agent's shutdown
    report(log, "12.1", "completed", 0)  # ended on its own while the API was down
    register(log, "i2")
    made = settle(log, "i2")
    assert exits(log) == [("11.1", "lost", 143), ("12.1", "completed", 0)]
    restarted = [e for e in made if e.event_type == "TrialRestarted"]
    assert [(e.trial_id, e.restarts) for e in restarted] == [(11, 0)]  # type: ignore[attr-defined]
    assert [e.allocation_id for e in made if isinstance(e, SlotsAllocated)] == ["11.2"]
    completed = [e.trial_id for e in made if isinstance(e, TrialStateChanged)]
    assert completed == [12]


def test_a_verdict_recorded_first_stands_against_a_later_report() -> None:
    """The agent registered anew before reporting (its report was lost with it): the verdict
    is the run's end, and a report folded after it changes nothing of what is decided."""
    log = two_running_trials()
    register(log, "i2")
    made = step(log, beat("i2", 0))
    assert types(made) == ["TrialExited", "SlotsReleased"] * 2
    report(log, "12.1", "completed", 0)  # had it reached the log, it would not be the end
    made = step(log, beat("i2", 1))
    assert types(made) == ["TrialRestarted", "TrialRestarted"]
    assert log.state.trials[12].state == "ACTIVE"


def leave(log: Log, incarnation: str) -> None:
    log.add("agent-a", AgentLeaving(agent_id="a", incarnation=incarnation))


def test_a_leaving_agent_takes_no_restart_until_it_registers_anew() -> None:
    """``cairn down`` with agents first: the agent says it is leaving, then reports its runs'
    shutdown exits while the scheduler runs on. The runs restart uncounted but are placed only
    once the agent registers anew, so no run is placed on the leaving process and lost."""
    log = two_running_trials()
    leave(log, "i1")
    report(log, "11.1", "lost", 143)
    report(log, "12.1", "lost", 143)
    made = settle(log, "i1")
    assert types(made) == ["TrialRestarted", "TrialRestarted"]
    assert [e.restarts for e in made] == [0, 0]  # type: ignore[attr-defined]
    register(log, "i2")
    made = settle(log, "i2")
    assert types(made) == ["SlotsAllocated", "SlotsAllocated"]
    assert exits(log) == [("11.1", "lost", 143), ("12.1", "lost", 143)]


def test_without_leaving_a_restart_goes_to_the_departing_process_and_is_lost() -> None:
    """The mechanism the announcement prevents: a shutdown exit reported while the scheduler
    runs, with no ``AgentLeaving``, restarts the run on the departing process; its next
    registration declares that run (never started) lost, a second run lost for one stop."""
    log = two_running_trials()
    report(log, "11.1", "lost", 143)
    made = settle(log, "i1")
    assert [e.allocation_id for e in made if isinstance(e, SlotsAllocated)] == ["11.2"]
    register(log, "i2")
    settle(log, "i2")
    assert [x for x in exits(log) if x[0].startswith("11.")] == [
        ("11.1", "lost", 143),
        ("11.2", "lost", None),
    ]


def test_a_late_leaving_of_an_older_process_keeps_the_agent_placeable() -> None:
    """An ``AgentLeaving`` of an incarnation other than the registered one (a previous process's
    announcement, folded late) does not keep work from the agent's current process."""
    log = Log()
    register(log, "i2", slots=1)
    leave(log, "i1")
    experiment(log, 1, 1)
    assert types(step(log)) == ["SlotsAllocated"]


def test_the_agent_fold_is_leaving_until_it_registers_anew() -> None:
    """The API's fold of the agent stream: leaving only for the registered process, and ended
    by the next registration (so the API records one AgentLeaving per process)."""
    log = Log()
    register(log, "i1")
    leave(log, "i0")
    assert not fold_agent("a", log.events).leaving
    leave(log, "i1")
    assert fold_agent("a", log.events).leaving
    register(log, "i2")
    assert not fold_agent("a", log.events).leaving
