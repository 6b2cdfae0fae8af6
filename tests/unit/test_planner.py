"""The scheduler's planner as a pure function of the folded log."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from events.domain.names import allocation_id, trial_stream
from events.domain.types import (
    AgentRegistered,
    CheckpointSaved,
    ExperimentStateChanged,
    ExperimentSubmitted,
    SlotsDisabled,
    SlotsEnabled,
    TrialExited,
    TrialKillRequested,
    TrialRequested,
    TrialStopRequested,
)
from events.domain.types.agent import Slot
from events.log.envelope import Event, Metadata, RecordedEvent
from events.log.registry import encode
from services.scheduler.planner import Settings, plan, reap
from services.scheduler.state import ClusterState


class Log:
    """Folds events into a ClusterState and feeds the planner's decisions back, like the service."""

    def __init__(self) -> None:
        self.state = ClusterState()
        self.position = 0
        self.versions: dict[str, int] = {}
        self.events: list[RecordedEvent] = []

    def add(self, stream: str, event: Event) -> RecordedEvent:
        self.position += 1
        self.versions[stream] = self.versions.get(stream, 0) + 1
        recorded = RecordedEvent(
            position=self.position,
            stream_id=stream,
            stream_version=self.versions[stream],
            event_id=uuid.uuid4(),
            type=event.event_type,
            schema_version=event.schema_version,
            payload=encode(event),
            metadata=Metadata(),
            recorded_at=datetime.now(UTC),
        )
        self.events.append(recorded)
        self.state.apply(recorded)
        return recorded

    def step(self, settings: Settings = Settings()) -> list[Event]:
        decisions = plan(self.state, settings)
        for stream, event in decisions:
            self.add(stream, event)
        return [e for _, e in decisions]

    def settle(self) -> list[Event]:
        out: list[Event] = []
        for _ in range(20):
            made = self.step()
            if not made:
                return out
            out += made
        raise AssertionError("planner did not settle")


def experiment(log: Log, exp: int, trials: int, **resources: Any) -> None:
    config = {"resources": {"slots_per_trial": 1, **resources}, "max_restarts": 1}
    log.add(f"experiment-{exp}", ExperimentSubmitted(experiment_id=exp, config=config))
    for n in range(1, trials + 1):
        log.add(
            f"experiment-{exp}",
            TrialRequested(
                experiment_id=exp,
                trial_id=exp * 10 + n,
                seq=n,
                request_id=f"r{n}",
                hparams={},
                trial_seed=n,
            ),
        )


def agent(log: Log, name: str, slots: int) -> None:
    log.add(
        f"agent-{name}",
        AgentRegistered(agent_id=name, slots=[Slot(slot_id=str(i)) for i in range(slots)]),
    )


def types(events: list[Event]) -> list[str]:
    return [e.event_type for e in events]


def exit_run(log: Log, trial: int, run: int, outcome: str) -> None:
    log.add(
        trial_stream(trial),
        TrialExited(
            trial_id=trial,
            run_id=run,
            allocation_id=allocation_id(trial, run),
            outcome=outcome,  # type: ignore[arg-type]
        ),
    )


def test_pending_trials_fill_free_slots_and_wait_for_more() -> None:
    """Three 1-slot trials on a 2-slot agent: two are allocated, the third waits for a free slot."""
    log = Log()
    agent(log, "a", 2)
    experiment(log, 1, 3)
    made = log.step()
    assert types(made) == ["SlotsAllocated", "SlotsAllocated"]
    assert log.step() == []
    exit_run(log, 11, 1, "completed")
    made = log.settle()
    assert types(made) == ["TrialStateChanged", "SlotsAllocated"]
    assert made[1].trial_id == 13  # type: ignore[attr-defined]


def test_failed_run_restarts_from_latest_checkpoint_then_errors() -> None:
    """A failing trial restarts with its latest checkpoint until max_restarts, then is ERROR."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1)
    log.settle()
    log.add("trial-11", CheckpointSaved(trial_id=11, run_id=1, uuid="ck-1", steps_completed=10))
    exit_run(log, 11, 1, "failed")
    made = log.settle()
    assert types(made) == ["TrialRestarted", "SlotsAllocated"]
    assert made[0].latest_checkpoint == "ck-1"  # type: ignore[attr-defined]
    assert made[1].run_id == 2  # type: ignore[attr-defined]
    exit_run(log, 11, 2, "failed")
    made = log.settle()
    assert [(e.event_type, getattr(e, "state", None)) for e in made] == [
        ("TrialStateChanged", "ERROR")
    ]


def test_pause_preempts_and_activate_requeues() -> None:
    """Pausing asks running trials to preempt; after they exit, activating schedules them again."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1)
    log.settle()
    log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="PAUSED"))
    made = log.settle()
    assert types(made) == ["PreemptionRequested"]
    assert made[0].agent_ids == ["a"]  # type: ignore[attr-defined]
    exit_run(log, 11, 1, "preempted")
    assert [getattr(e, "reason", "") for e in log.settle()] == ["requeue"]
    log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="ACTIVE"))
    made = log.settle()
    assert types(made) == ["SlotsAllocated"] and made[0].run_id == 2  # type: ignore[attr-defined]


def test_kill_kills_running_and_cancels_experiment() -> None:
    """Killing an experiment kills running trials, cancels queued ones, then ends CANCELED."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 2)
    log.settle()
    log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="STOPPING_KILLED"))
    made = log.settle()
    assert sorted(types(made)) == ["KillRequested", "TrialStateChanged"]
    exit_run(log, 11, 1, "killed")
    made = log.settle()
    assert [(e.event_type, getattr(e, "state", None)) for e in made] == [
        ("TrialStateChanged", "CANCELED"),
        ("ExperimentStateChanged", "CANCELED"),
    ]


def test_higher_priority_experiment_preempts_lower() -> None:
    """A priority-10 trial that cannot fit preempts the running priority-50 trial, then runs."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1, priority=50)
    log.settle()
    experiment(log, 2, 1, priority=10)
    made = log.settle()
    assert types(made) == ["PreemptionRequested"] and made[0].trial_id == 11  # type: ignore[attr-defined]
    exit_run(log, 11, 1, "preempted")
    made = log.settle()
    assert ("SlotsAllocated", 21) in [(e.event_type, getattr(e, "trial_id", "")) for e in made]


def test_searcher_stop_completes_trial() -> None:
    """A searcher stop preempts the run and the trial completes when it exits."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1)
    log.settle()
    log.add("experiment-1", TrialStopRequested(experiment_id=1, trial_id=11, request_id="r1"))
    assert types(log.settle()) == ["PreemptionRequested"]
    exit_run(log, 11, 1, "preempted")
    assert [getattr(e, "state", None) for e in log.settle()] == ["COMPLETED"]


def test_silent_agent_is_lost_and_its_runs_restart_elsewhere() -> None:
    """An agent past the heartbeat timeout is lost; its run is lost and rescheduled on another agent."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1)
    log.settle()
    agent(log, "b", 1)
    lost = reap(log.state, {"a": 0.0, "b": 100.0}, now=100.0, timeout=15.0)
    assert types([e for _, e in lost]) == ["AgentLost", "TrialExited", "SlotsReleased"]
    for stream, event in lost:
        log.add(stream, event)
    made = log.settle()
    assert types(made) == ["TrialRestarted", "SlotsAllocated"]
    assert list(made[1].placements) == ["b"]  # type: ignore[attr-defined]
    assert made[0].restarts == 0, "a lost agent does not count against max_restarts"  # type: ignore[attr-defined]


def test_replaying_the_log_decides_nothing_new() -> None:
    """Refolding the same log from scratch gives a state for which the planner has nothing to add."""
    log = Log()
    agent(log, "a", 2)
    experiment(log, 1, 4)
    log.settle()
    exit_run(log, 11, 1, "failed")
    log.settle()
    fresh = ClusterState()
    for event in log.events:
        fresh.apply(event)
    assert plan(fresh, Settings()) == []


def test_user_kill_of_one_trial_kills_its_run_and_cancels_only_it() -> None:
    """TrialKillRequested kills that trial's run and ends it CANCELED; its sibling keeps running."""
    log = Log()
    agent(log, "a", 2)
    experiment(log, 1, 2)
    log.settle()
    log.add("trial-11", TrialKillRequested(trial_id=11, actor="alice"))
    made = log.settle()
    assert types(made) == ["KillRequested"]
    assert made[0].allocation_id == "11.1"  # type: ignore[attr-defined]
    exit_run(log, 11, 1, "killed")
    made = log.settle()
    assert [(e.event_type, getattr(e, "state", None)) for e in made] == [
        ("TrialStateChanged", "CANCELED")
    ]
    assert log.state.trials[12].live and log.state.trials[12].running


def test_user_kill_of_a_waiting_trial_cancels_it_without_running() -> None:
    """A trial killed before it got slots is CANCELED and never allocated."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 2)
    log.settle()
    log.add("trial-12", TrialKillRequested(trial_id=12))
    made = log.settle()
    assert [(e.event_type, getattr(e, "state", None)) for e in made] == [
        ("TrialStateChanged", "CANCELED")
    ]


def test_disabled_slots_get_no_work_and_their_runs_are_preempted_unless_draining() -> None:
    """Disabling a slot preempts its run (requeued elsewhere); drain lets it finish; enable restores."""
    log = Log()
    agent(log, "a", 1)
    agent(log, "b", 1)
    experiment(log, 1, 1)
    made = log.settle()
    assert made[0].placements == {"a": ["0"]}  # type: ignore[attr-defined]
    log.add("agent-a", SlotsDisabled(agent_id="a"))
    made = log.settle()
    assert types(made) == ["PreemptionRequested"]
    exit_run(log, 11, 1, "preempted")
    made = log.settle()
    assert types(made) == ["TrialStateChanged", "SlotsAllocated"]
    assert made[1].placements == {"b": ["0"]}  # type: ignore[attr-defined]
    log.add("agent-b", SlotsDisabled(agent_id="b", slot_ids=["0"], drain=True))
    assert log.settle() == []
    exit_run(log, 11, 2, "completed")
    experiment(log, 2, 1)
    made = log.settle()
    assert "SlotsAllocated" not in types(made)
    log.add("agent-b", SlotsEnabled(agent_id="b"))
    made = log.settle()
    assert types(made) == ["SlotsAllocated"]
    assert made[0].placements == {"b": ["0"]}  # type: ignore[attr-defined]
