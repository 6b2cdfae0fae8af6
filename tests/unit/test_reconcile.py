"""The planner reconciles the runs it believes open with what agents report (pure, no I/O)."""

from __future__ import annotations

from events.domain.names import parse_allocation_id, trial_stream
from events.domain.types import AgentRegistered, CheckpointSaved, SlotsAllocated, TrialStarted
from events.domain.types.agent import Slot
from events.log.envelope import Event
from services.scheduler.planner import Report, Reports, Settings, plan
from tests.unit.test_planner import Log, experiment, types


def register(log: Log, incarnation: str, slots: int = 2) -> None:
    slot_list = [Slot(slot_id=str(i)) for i in range(slots)]
    log.add("agent-a", AgentRegistered(agent_id="a", slots=slot_list, incarnation=incarnation))


def step(log: Log, reports: Reports | None = None) -> list[Event]:
    decisions = plan(log.state, Settings(), reports)
    for stream, event in decisions:
        log.add(stream, event)
    return [e for _, e in decisions]


def start(log: Log, allocation_id: str, incarnation: str, listed_from: int) -> None:
    trial_id, run_id = parse_allocation_id(allocation_id)
    started = TrialStarted(
        trial_id=trial_id,
        allocation_id=allocation_id,
        run_id=run_id,
        agent_id="a",
        agent_incarnation=incarnation,
        listed_from=listed_from,
    )
    log.add(trial_stream(trial_id), started)


def beat(incarnation: str, seq: int, *running: str, exits: frozenset[str] = frozenset()) -> Reports:
    report = Report(incarnation=incarnation, seq=seq, running=frozenset(running))
    return Reports(agents={"a": report}, exits_unfolded=exits)


def two_running_trials() -> Log:
    """Agent ``a`` (incarnation i1, 2 slots) runs 1.1.1 and 1.2.1, started at heartbeats 3 and 4."""
    log = Log()
    register(log, "i1")
    experiment(log, 1, 2)
    assert types(step(log)) == ["SlotsAllocated", "SlotsAllocated"]
    start(log, "11.1", "i1", listed_from=3)
    log.add("trial-11", CheckpointSaved(trial_id=11, run_id=1, uuid="ck", steps_completed=5))
    start(log, "12.1", "i1", listed_from=4)
    return log


def test_a_new_incarnation_loses_every_run_placed_before_it_and_they_restart() -> None:
    """The agent re-registers with the same slots but a new incarnation: both runs are lost and
    restarted (the first from its checkpoint), without counting as a failure."""
    log = two_running_trials()
    assert step(log, beat("i1", 5, "11.1", "12.1")) == []
    register(log, "i2")
    made = step(log, beat("i2", 0))
    assert types(made) == ["TrialExited", "SlotsReleased"] * 2
    assert {(e.allocation_id, e.outcome) for e in made if e.event_type == "TrialExited"} == {  # type: ignore[attr-defined]
        ("11.1", "lost"),
        ("12.1", "lost"),
    }
    made = step(log, beat("i2", 1))
    restarted = [e for e in made if e.event_type == "TrialRestarted"]
    assert [(e.trial_id, e.restarts, e.latest_checkpoint) for e in restarted] == [  # type: ignore[attr-defined]
        (11, 0, "ck"),
        (12, 0, None),
    ]
    made = step(log, beat("i2", 2))
    assert [e.allocation_id for e in made if isinstance(e, SlotsAllocated)] == ["11.2", "12.2"]


def test_a_run_missing_from_a_heartbeat_after_listed_from_is_lost_once() -> None:
    """Same incarnation: heartbeat 5 without 1.2.1 (listed from 4) loses it; replaying the same
    report after the decision was folded decides nothing more."""
    log = two_running_trials()
    made = step(log, beat("i1", 5, "11.1"))
    assert types(made) == ["TrialExited", "SlotsReleased"]
    assert made[0].allocation_id == "12.1" and made[0].outcome == "lost"  # type: ignore[attr-defined]
    assert "heartbeat 5" in made[0].message  # type: ignore[attr-defined]
    made = step(log, beat("i1", 5, "11.1"))
    assert types(made) == ["TrialRestarted"]
    assert types(step(log, beat("i1", 6, "11.1"))) == ["SlotsAllocated"]
    assert step(log, beat("i1", 6, "11.1")) == []


def test_a_heartbeat_computed_before_the_start_proves_nothing() -> None:
    """A heartbeat numbered below ``listed_from`` (in flight when the agent took the run, delivered
    after TrialStarted) lacks the run and yet does not lose it."""
    log = two_running_trials()
    assert step(log, beat("i1", 3, "11.1")) == []
    assert step(log, beat("i1", 2)) == []


def test_a_just_allocated_run_is_never_judged_by_heartbeats() -> None:
    """Allocated, not yet started: however many heartbeats lack it, the agent may not have
    received the start command yet, so nothing is decided."""
    log = Log()
    register(log, "i1", slots=1)
    experiment(log, 1, 1)
    assert types(step(log)) == ["SlotsAllocated"]
    assert step(log, beat("i1", 1_000)) == []
    start(log, "11.1", "i1", listed_from=1_001)
    assert step(log, beat("i1", 1_000)) == []
    assert step(log, beat("i1", 1_001, "11.1")) == []


def test_an_exit_in_the_log_but_not_yet_folded_is_not_a_loss() -> None:
    """The agent drops a run after its exit report was committed; while the scheduler has not
    folded that exit, the run's absence must not become a second, 'lost' exit."""
    log = two_running_trials()
    assert step(log, beat("i1", 9, "11.1", exits=frozenset({"12.1"}))) == []


def test_another_incarnations_heartbeat_does_not_judge_a_run() -> None:
    """A heartbeat of another process of the agent (a new one not yet registered, or an old one
    delivered late) does not say anything about runs this process started."""
    log = two_running_trials()
    assert step(log, beat("i0", 99)) == []
    assert step(log, beat("i2", 99)) == []


def test_runs_started_without_the_promise_are_left_to_the_other_rules() -> None:
    """A TrialStarted without an incarnation (v1, or an older agent) is not judged by heartbeats."""
    log = Log()
    register(log, "")
    experiment(log, 1, 1)
    step(log)
    log.add("trial-11", TrialStarted(trial_id=11, allocation_id="11.1", run_id=1, agent_id="a"))
    assert step(log, beat("", 50)) == []
