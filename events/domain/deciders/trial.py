"""The trial's deciders: a user's kill, and an agent's reports on one run (started, exited,
joined the rendezvous of a run placed on several agents, asked by its resource manager to give
the run back).

Each ``decide_*`` is pure over the trial's folded state and a command and returns the events
to append to the trial's stream (``[]``: a repeat, nothing to record) or a
:class:`~events.domain.deciders.Refusal`. Who may act (the owner or an admin; the agent holding
the run) is the caller's check, and so is the intake's idempotency (a report claimed before is
answered from the inbox without deciding again).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from events.domain import lifecycle
from events.domain.aggregates import AllocationView, ExperimentView, TrialView
from events.domain.deciders import Decision, conflict, invalid, not_found
from events.domain.types import (
    PreemptionRequested,
    RendezvousJoined,
    SlotsReleased,
    TrialExited,
    TrialKillRequested,
    TrialStarted,
)
from events.log.envelope import Event

Outcome = Literal["completed", "failed", "killed", "preempted", "lost"]


# --- kill ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KillTrial:
    """A user's kill of trial ``trial_id``: the scheduler kills its run and ends it CANCELED."""

    trial_id: int
    actor: str


def decide_kill(experiment: ExperimentView, control: TrialView, command: KillTrial) -> Decision:
    """``TrialKillRequested``; ``[]`` while a kill is pending already.

    Refused: not found when the experiment never requested the trial; conflict when the trial
    or its experiment has ended.
    """
    trial_id = command.trial_id
    if trial_id not in experiment.trials:
        return not_found(f"no trial {trial_id}")
    if control.state in lifecycle.TERMINAL or experiment.state in lifecycle.ENDED:
        return conflict(f"trial {trial_id} has ended ({control.state})")
    if control.kill_pending:
        return []
    return [TrialKillRequested(trial_id=trial_id, actor=command.actor)]


# --- an agent's reports on a run ----------------------------------------------------------


def _not_holding(agent_id: str, alloc: AllocationView) -> Decision | None:
    if agent_id not in alloc.placements:
        return invalid(f"agent {agent_id} has no slots in {alloc.allocation_id}", "agent_id")
    return None


@dataclass(frozen=True)
class ReportStarted:
    """Agent ``agent_id`` launched the run's process.

    Attributes:
        warm_start_checkpoint: the checkpoint the trial's request starts it from (population
            based training), restored when the trial has none of its own yet.
    """

    agent_id: str
    incarnation: str = ""
    listed_from: int | None = None
    warm_start_checkpoint: str | None = None


def decide_started(trial: TrialView, alloc: AllocationView, command: ReportStarted) -> Decision:
    """``TrialStarted`` naming the checkpoint the run restores; ``[]`` once the run started or
    ended. Refused (invalid at ``agent_id``) from an agent holding no slots in the run."""
    refused = _not_holding(command.agent_id, alloc)
    if refused is not None:
        return refused
    if alloc.started or alloc.exited:
        return []
    checkpoint = trial.latest_checkpoint
    return [
        TrialStarted(
            trial_id=trial.trial_id,
            allocation_id=alloc.allocation_id,
            run_id=alloc.run_id,
            agent_id=command.agent_id,
            restored_checkpoint=checkpoint.uuid if checkpoint else command.warm_start_checkpoint,
            agent_incarnation=command.incarnation,
            listed_from=command.listed_from,
        )
    ]


def exit_outcome(alloc: AllocationView, exit_code: int, *, agent_shutdown: bool = False) -> Outcome:
    """How a run ended (protocol.md): killed > preempted > lost (its agent stopped it while
    shutting down, whatever the exit code) > completed (exit 0) > failed."""
    if alloc.kill:
        return "killed"
    if alloc.preempt:
        return "preempted"
    if agent_shutdown:
        return "lost"
    return "completed" if exit_code == 0 else "failed"


@dataclass(frozen=True)
class ReportExited:
    """The run's process on agent ``agent_id`` ended with ``exit_code``."""

    agent_id: str
    exit_code: int
    message: str = ""
    agent_shutdown: bool = False


def decide_exited(trial: TrialView, alloc: AllocationView, command: ReportExited) -> Decision:
    """``TrialExited`` (its outcome from :func:`exit_outcome`) and ``SlotsReleased``; ``[]``
    once the run has ended (one end per run: a verdict recorded first stands). Refused (invalid
    at ``agent_id``) from an agent holding no slots in the run."""
    refused = _not_holding(command.agent_id, alloc)
    if refused is not None:
        return refused
    if alloc.exited:
        return []
    outcome = exit_outcome(alloc, command.exit_code, agent_shutdown=command.agent_shutdown)
    return [
        TrialExited(
            trial_id=trial.trial_id,
            run_id=alloc.run_id,
            allocation_id=alloc.allocation_id,
            outcome=outcome,
            exit_code=command.exit_code,
            message=command.message,
        ),
        SlotsReleased(
            trial_id=trial.trial_id, allocation_id=alloc.allocation_id, placements=alloc.placements
        ),
    ]


def outcome_of(events: list[Event]) -> Outcome | None:
    """The outcome :func:`decide_exited` decided (``None``: it decided nothing)."""
    for event in events:
        if isinstance(event, TrialExited):
            return event.outcome
    return None


@dataclass(frozen=True)
class RequestPendingPreemption:
    """The resource manager that started agent ``agent_id`` (Slurm: ``scancel``, a time limit)
    signalled it to give its slots back: the run is to checkpoint and exit, as when the
    scheduler preempts it.

    Attributes:
        reason: what the agent was told, recorded in the event's reason.
    """

    agent_id: str
    reason: str


def decide_pending_preemption(
    trial: TrialView, alloc: AllocationView, command: RequestPendingPreemption
) -> Decision:
    """``PreemptionRequested`` for the run, naming every agent of it (as the scheduler's); ``[]``
    once a preemption or kill is pending for the run or it is no longer the trial's current
    run (nothing left to give back). Refused (invalid at ``agent_id``) from an agent holding
    no slots in the run."""
    refused = _not_holding(command.agent_id, alloc)
    if refused is not None:
        return refused
    if alloc.preempt or alloc.kill or not trial.is_current(alloc.allocation_id):
        return []
    return [
        PreemptionRequested(
            trial_id=trial.trial_id,
            allocation_id=alloc.allocation_id,
            reason=f"the resource manager signalled the job: {command.reason}",
            agent_ids=sorted(alloc.placements),
        )
    ]


# --- rendezvous ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RendezvousState:
    """A run's rendezvous as far as joining decides.

    Attributes:
        placements: the agents holding slots in the run.
        members: the agents that joined already.
        current: whether the run is still its trial's current run.
        repeat: whether this (run, agent) join was taken in before (an idempotent repeat).
    """

    placements: Collection[str]
    members: Collection[str]
    current: bool
    repeat: bool = False


@dataclass(frozen=True)
class JoinRendezvous:
    """Agent ``agent_id`` of run ``allocation_id`` joins its rendezvous at ``address:port``."""

    trial_id: int
    allocation_id: str
    agent_id: str
    address: str
    port: int


def decide_join(state: RendezvousState, command: JoinRendezvous) -> Decision:
    """``RendezvousJoined``; ``[]`` for a repeat or an agent that joined already.

    Refused: invalid (at ``agent_id``) from an agent holding no slots in the run; conflict when
    the run is no longer its trial's current run.
    """
    if command.agent_id not in state.placements:
        return invalid(
            f"agent {command.agent_id} has no slots in {command.allocation_id}", "agent_id"
        )
    if state.repeat or command.agent_id in state.members:
        return []
    if not state.current:
        return conflict(f"allocation {command.allocation_id} is no longer its trial's current run")
    return [
        RendezvousJoined(
            trial_id=command.trial_id,
            allocation_id=command.allocation_id,
            agent_id=command.agent_id,
            address=command.address,
            port=command.port,
        )
    ]
