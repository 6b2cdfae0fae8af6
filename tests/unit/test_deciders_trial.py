"""The trial's deciders (:mod:`events.domain.deciders.trial`): a user's kill and an agent's
reports on a run (started, exited, rendezvous, a resource manager's preemption), over folded
state; no HTTP, no database."""

from __future__ import annotations

import pytest

from events.domain import lifecycle
from events.domain.aggregates import AllocationView, ExperimentView, TrialView
from events.domain.deciders import Refusal
from events.domain.deciders.trial import (
    JoinRendezvous,
    KillTrial,
    RendezvousState,
    ReportExited,
    ReportStarted,
    RequestPendingPreemption,
    decide_exited,
    decide_join,
    decide_kill,
    decide_pending_preemption,
    decide_started,
    outcome_of,
)
from events.domain.types import (
    CheckpointSaved,
    PreemptionRequested,
    RendezvousJoined,
    SlotsReleased,
    TrialExited,
    TrialKillRequested,
    TrialRequested,
    TrialStarted,
)

TRIAL = 21
ALLOC = f"{TRIAL}.2"


def control(state: str = lifecycle.ACTIVE, kill_pending: bool = False) -> TrialView:
    """A trial's lifecycle state and pending kill, as the gateway folds them."""
    return TrialView(TRIAL, state=state, kill_pending=kill_pending)


def experiment(state: str = lifecycle.ACTIVE) -> ExperimentView:
    """An experiment that requested trial ``TRIAL``."""
    request = TrialRequested(
        experiment_id=3, trial_id=TRIAL, seq=1, request_id="r1", hparams={}, trial_seed=1
    )
    return ExperimentView(3, submitted=True, owner="alice", state=state, trials={TRIAL: request})


def run(**flags: bool) -> tuple[TrialView, AllocationView]:
    """The trial with its run 2 on agent ``a1`` (and ``flags`` set on the allocation)."""
    alloc = AllocationView(ALLOC, run_id=2, placements={"a1": ["0"]})
    for flag, value in flags.items():
        if flag == "preempt":
            alloc.preemption = "priority" if value else None
        else:
            setattr(alloc, flag, value)
    trial = TrialView(TRIAL, version=5, allocations={ALLOC: alloc}, latest_allocation=ALLOC)
    return trial, alloc


def test_kill_of_a_running_trial_is_requested_once() -> None:
    """A kill records TrialKillRequested; while it is pending a second kill decides nothing."""
    command = KillTrial(trial_id=TRIAL, actor="alice")
    assert decide_kill(experiment(), control(), command) == [
        TrialKillRequested(trial_id=TRIAL, actor="alice")
    ]
    assert decide_kill(experiment(), control(kill_pending=True), command) == []


def test_kill_of_a_trial_the_experiment_never_requested_is_not_found() -> None:
    """A trial id outside the experiment's requests is unknown."""
    decision = decide_kill(experiment(), control(), KillTrial(trial_id=99, actor="a"))
    assert decision == Refusal("not_found", "no trial 99")


@pytest.mark.parametrize(
    ("experiment_state", "trial_state"),
    [(lifecycle.ACTIVE, lifecycle.COMPLETED), (lifecycle.DELETING, lifecycle.ACTIVE)],
)
def test_kill_of_an_ended_trial_or_experiment_is_a_conflict(
    experiment_state: str, trial_state: str
) -> None:
    """A trial that ended, or whose experiment ended, cannot be killed."""
    decision = decide_kill(
        experiment(experiment_state), control(trial_state), KillTrial(TRIAL, "a")
    )
    assert decision == Refusal("conflict", f"trial {TRIAL} has ended ({trial_state})")


def test_started_restores_the_latest_checkpoint_else_the_warm_start() -> None:
    """TrialStarted names the trial's latest checkpoint, or the request's warm start without one."""
    trial, alloc = run()
    command = ReportStarted(agent_id="a1", incarnation="i", warm_start_checkpoint="parent")
    [started] = decide_started(trial, alloc, command)  # type: ignore[misc]
    assert isinstance(started, TrialStarted) and started.restored_checkpoint == "parent"
    trial.latest_checkpoint = CheckpointSaved(
        trial_id=TRIAL, run_id=1, uuid="own", steps_completed=3
    )
    [started] = decide_started(trial, alloc, command)  # type: ignore[misc]
    assert isinstance(started, TrialStarted) and started.restored_checkpoint == "own"
    assert (started.run_id, started.agent_id, started.agent_incarnation) == (2, "a1", "i")


def test_started_twice_or_after_the_end_decides_nothing() -> None:
    """A run that started (or ended) already records no second TrialStarted."""
    for flags in ({"started": True}, {"exited": True}):
        trial, alloc = run(**flags)
        assert decide_started(trial, alloc, ReportStarted(agent_id="a1")) == []


def test_a_report_from_an_agent_without_slots_in_the_run_is_invalid() -> None:
    """Started and exited from an agent the run is not placed on are refused at agent_id."""
    trial, alloc = run()
    expected = Refusal("invalid", f"agent a9 has no slots in {ALLOC}", "agent_id")
    assert decide_started(trial, alloc, ReportStarted(agent_id="a9")) == expected
    assert decide_exited(trial, alloc, ReportExited(agent_id="a9", exit_code=0)) == expected


@pytest.mark.parametrize(
    ("flags", "exit_code", "shutdown", "outcome"),
    [
        ({"kill": True, "preempt": True}, 0, True, "killed"),
        ({"preempt": True}, 1, True, "preempted"),
        ({}, 0, True, "lost"),
        ({}, 0, False, "completed"),
        ({}, 3, False, "failed"),
    ],
)
def test_exited_ends_the_run_with_its_outcome_and_releases_its_slots(
    flags: dict[str, bool], exit_code: int, shutdown: bool, outcome: str
) -> None:
    """killed > preempted > lost (agent shutdown) > completed (exit 0) > failed, then the
    run's slots are released."""
    trial, alloc = run(**flags)
    command = ReportExited(agent_id="a1", exit_code=exit_code, agent_shutdown=shutdown)
    events = decide_exited(trial, alloc, command)
    assert isinstance(events, list)
    exited, released = events
    assert isinstance(exited, TrialExited) and exited.outcome == outcome
    assert released == SlotsReleased(
        trial_id=TRIAL, allocation_id=ALLOC, placements=alloc.placements
    )
    assert outcome_of(events) == outcome


def test_exited_twice_keeps_the_first_verdict() -> None:
    """A run that ended records no second end (outcome None)."""
    trial, alloc = run(exited=True)
    assert decide_exited(trial, alloc, ReportExited(agent_id="a1", exit_code=1)) == []
    assert outcome_of([]) is None


JOIN = JoinRendezvous(trial_id=TRIAL, allocation_id=ALLOC, agent_id="a1", address="h", port=9)


def test_join_records_the_agents_endpoint_once() -> None:
    """A first join records RendezvousJoined; a member joining again, or a repeat, nothing."""
    state = RendezvousState(placements={"a1", "a2"}, members=set(), current=True)
    assert decide_join(state, JOIN) == [
        RendezvousJoined(trial_id=TRIAL, allocation_id=ALLOC, agent_id="a1", address="h", port=9)
    ]
    assert decide_join(RendezvousState({"a1"}, {"a1"}, current=True), JOIN) == []
    assert decide_join(RendezvousState({"a1"}, set(), current=True, repeat=True), JOIN) == []


def test_join_from_an_agent_without_slots_is_invalid_and_of_a_stale_run_a_conflict() -> None:
    """An agent the run is not placed on is refused at agent_id; a run no longer current, 409."""
    assert decide_join(RendezvousState({"a2"}, set(), current=True), JOIN) == Refusal(
        "invalid", f"agent a1 has no slots in {ALLOC}", "agent_id"
    )
    assert decide_join(RendezvousState({"a1"}, set(), current=False), JOIN) == Refusal(
        "conflict", f"allocation {ALLOC} is no longer its trial's current run"
    )


def test_pending_preemption_from_the_holding_agent_is_requested_as_the_scheduler_would() -> None:
    """The agent holding the run asks: PreemptionRequested for the run, naming its agents."""
    trial, alloc = run(started=True)
    command = RequestPendingPreemption(agent_id="a1", reason="SIGTERM")
    assert decide_pending_preemption(trial, alloc, command) == [
        PreemptionRequested(
            trial_id=TRIAL,
            allocation_id=ALLOC,
            reason="the resource manager signalled the job: SIGTERM",
            agent_ids=["a1"],
        )
    ]


def test_pending_preemption_from_an_agent_without_slots_in_the_run_is_refused() -> None:
    """Another agent's request is invalid at agent_id and records nothing."""
    trial, alloc = run(started=True)
    decision = decide_pending_preemption(trial, alloc, RequestPendingPreemption("a2", "SIGTERM"))
    assert isinstance(decision, Refusal)
    assert (decision.reason, decision.field) == ("invalid", "agent_id")


@pytest.mark.parametrize("flag", ["preempt", "kill", "exited"])
def test_pending_preemption_once_a_stop_is_pending_or_the_run_ended_decides_nothing(
    flag: str,
) -> None:
    """With a preemption or kill pending, or the run over, a request appends nothing."""
    trial, alloc = run(started=True, **{flag: True})
    assert decide_pending_preemption(trial, alloc, RequestPendingPreemption("a1", "SIGTERM")) == []
