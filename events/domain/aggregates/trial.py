"""The trial fold: a trial's runs (allocations), its current run, restarts, checkpoint, state.

A trial's own stream carries its runs; its request is on the experiment's stream (read by
:class:`~events.domain.aggregates.cluster.Cluster`, which sets ``experiment_id``,
``requested_position`` and the warm start). The API folds one trial's stream alone; the
scheduler folds every trial through the cluster. Both apply the rules here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from events.domain import lifecycle
from events.domain.types import (
    CheckpointSaved,
    KillRequested,
    PreemptionRequested,
    SlotsAllocated,
    SlotsReleased,
    TrialEarlyExited,
    TrialExited,
    TrialKillRequested,
    TrialRestarted,
    TrialStarted,
    TrialStateChanged,
    TrialStopRequested,
)
from events.log.envelope import Event, RecordedEvent

TRIAL_FACTS = (
    "SlotsAllocated",
    "TrialStarted",
    "TrialExited",
    "PreemptionRequested",
    "KillRequested",
    "CheckpointSaved",
    "TrialStateChanged",
    "TrialEarlyExited",
    "SlotsReleased",
    "TrialRestarted",
    "TrialStopRequested",
    "TrialKillRequested",
)
"""What :func:`apply_trial` reads."""


@dataclass(frozen=True, slots=True)
class Starter:
    """The agent process that started a run, and the first of its heartbeats that lists it."""

    agent_id: str
    incarnation: str
    listed_from: int


@dataclass(slots=True)
class AllocationView:
    """One run of a trial on its slots.

    Its end is the first ``TrialExited`` (docs/protocol.md: one end per run); a later report of
    the same run changes nothing.
    """

    allocation_id: str
    run_id: int
    placements: dict[str, list[str]]
    position: int = 0
    """The log position of its ``SlotsAllocated`` (the order of runs across the cluster)."""
    started: bool = False
    started_by: Starter | None = None
    exited: bool = False
    outcome: str | None = None
    exit_code: int | None = None
    preemption: str | None = None
    """Why the run was asked to stop for others (``None``: it was not)."""
    kill: bool = False
    released: bool = False
    agent_id: str | None = None
    allocated_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def preempt(self) -> bool:
        """Whether the run was asked to stop (preempted)."""
        return self.preemption is not None

    @property
    def state(self) -> str:
        """``ASSIGNED``, ``RUNNING`` once started, ``TERMINATED`` once exited or released."""
        if self.exited or self.released:
            return "TERMINATED"
        return "RUNNING" if self.started else "ASSIGNED"


@dataclass(slots=True)
class TrialView:
    """A trial folded: its runs, the current one, restarts, latest checkpoint, requests, state."""

    trial_id: int
    experiment_id: int = 0
    requested_position: int = 0
    """The log position of its ``TrialRequested`` (0 when folded from its own stream alone)."""
    version: int = 0
    allocations: dict[str, AllocationView] = field(default_factory=dict)
    latest_allocation: str | None = None
    run: AllocationView | None = None
    """The run that holds (or is about to hold) the trial's slots: set by ``SlotsAllocated``,
    cleared by ``TrialRestarted``, by a requeue and by a state change after the run exited."""
    run_id: int = 0
    """The number of the latest run (the next one is ``run_id + 1``)."""
    restarts: int = 0
    latest_checkpoint: CheckpointSaved | None = None
    warm_start: str | None = None
    """The checkpoint the trial was requested to start from (a clone's parent's), if any."""
    state: str = lifecycle.ACTIVE
    ended_at: datetime | None = None
    """When the trial reached its terminal state (``None`` while it is not in one)."""
    early_exit: str | None = None
    stop_requested: bool = False
    kill_requested: bool = False
    kill_pending: bool = False
    """A user's kill was requested and the trial has not ended since."""
    requeue: bool = False
    """The current run was taken back for another (preempted, killed for a pause): the trial
    waits for slots again without counting a restart."""

    @property
    def early_exited(self) -> bool:
        """Whether the trial reported an early exit."""
        return self.early_exit is not None

    @property
    def resume_from(self) -> str | None:
        """The checkpoint the next run starts from: the latest saved, else the warm start."""
        if self.latest_checkpoint is not None:
            return self.latest_checkpoint.uuid
        return self.warm_start

    @property
    def terminal(self) -> bool:
        """Whether the trial has ended (COMPLETED, CANCELED or ERROR)."""
        return self.state in lifecycle.TERMINAL

    @property
    def live(self) -> bool:
        """Not yet ended (a trial in a state of ``lifecycle.ENDED`` never runs again)."""
        return self.state not in lifecycle.ENDED

    @property
    def running(self) -> bool:
        """Holds slots (allocated and not yet exited)."""
        return self.run is not None and not self.run.exited

    @property
    def started_at(self) -> datetime | None:
        """When the trial's first run started (``None``: none has)."""
        starts = [a.started_at for a in self.allocations.values() if a.started_at is not None]
        return min(starts) if starts else None

    def is_current(self, allocation_id: str) -> bool:
        """Whether ``allocation_id`` is the trial's latest allocation and has not exited."""
        alloc = self.allocations.get(allocation_id)
        return alloc is not None and allocation_id == self.latest_allocation and not alloc.exited

    @property
    def current_run_id(self) -> int | None:
        """The run id of the latest allocation, if any."""
        if self.latest_allocation is None:
            return None
        return self.allocations[self.latest_allocation].run_id

    def continued(self) -> None:
        """The trial was continued (``ExperimentContinued``): it starts over as a fresh request
        would, with no stop, kill or early exit pending and its restart budget whole."""
        self.stop_requested = False
        self.kill_requested = False
        self.early_exit = None
        self.restarts = 0


def fold_trial(trial_id: int, events: Iterable[RecordedEvent]) -> TrialView:
    """Folds a trial's stream."""
    view = TrialView(trial_id)
    for recorded in events:
        apply_trial(view, recorded)
    return view


def fold_allocation(allocation_id: str, events: Iterable[RecordedEvent]) -> AllocationView | None:
    """One allocation of a trial, folded from the trial's stream (``None``: never made)."""
    view = TrialView(0)
    for recorded in events:
        apply_trial(view, recorded)
    return view.allocations.get(allocation_id)


def apply_trial(view: TrialView, recorded: RecordedEvent, event: Event | None = None) -> bool:
    """Applies one trial event to ``view`` in place.

    Args:
        view: the trial folded so far.
        recorded: the event as the log holds it.
        event: ``recorded`` already decoded (decoded here when ``None``).

    Returns:
        Whether the event was applied; ``False`` for another type, or for a state change the
        state machine refuses (nothing of it is applied).
    """
    if recorded.stream_version > view.version:
        view.version = recorded.stream_version
    rule = _RULES.get(recorded.type)
    if rule is None:
        return False
    return rule(view, recorded.decode() if event is None else event, recorded)


_Rule = Callable[[TrialView, Any, RecordedEvent], bool]
_RULES: dict[str, _Rule] = {}
"""Event type -> the rule that applies it (dispatch by type: the fold is on the scheduler's hot
path, where a chain of ``isinstance`` checks costs more than the rules)."""

E = TypeVar("E", bound=Event)


def _rule(model: type[E]) -> Callable[[Callable[[TrialView, E, RecordedEvent], bool]], _Rule]:
    """Registers the decorated function as the rule of ``model``'s events (sound because
    :meth:`RecordedEvent.decode` of an event of that type returns a ``model``)."""

    def register(rule: Callable[[TrialView, E, RecordedEvent], bool]) -> _Rule:
        _RULES[model.event_type] = rule
        return rule

    return register


@_rule(SlotsAllocated)
def _allocated(view: TrialView, event: SlotsAllocated, recorded: RecordedEvent) -> bool:
    # A payload stored without run_id (before runs were numbered) is the trial's next run, not
    # the model's default of 1.
    view.run_id = event.run_id if "run_id" in event.model_fields_set else view.run_id + 1
    alloc = AllocationView(
        event.allocation_id,
        view.run_id,
        dict(event.placements),
        position=recorded.position,
        allocated_at=recorded.recorded_at,
    )
    view.allocations[event.allocation_id] = alloc
    view.latest_allocation = event.allocation_id
    view.run = alloc
    view.requeue = False
    return True


@_rule(TrialStateChanged)
def _state_changed(view: TrialView, event: TrialStateChanged, recorded: RecordedEvent) -> bool:
    after = lifecycle.next_trial_state(view.state, event.state)
    if after is None:  # refused by the state machine: nothing of it is applied
        return False
    if after != view.state:
        view.ended_at = recorded.recorded_at if after in lifecycle.TERMINAL else None
    view.kill_pending = view.kill_pending and after not in lifecycle.TERMINAL
    view.state = after
    if event.reason == "requeue":
        view.run = None
        view.requeue = True
    elif view.run is not None and view.run.exited:
        view.run = None
    return True


@_rule(TrialStarted)
def _started(view: TrialView, event: TrialStarted, recorded: RecordedEvent) -> bool:
    alloc = view.allocations.get(event.allocation_id)
    if alloc is not None:
        alloc.started = True
        alloc.started_at = alloc.started_at or recorded.recorded_at
        alloc.agent_id = alloc.agent_id or event.agent_id
        if event.agent_incarnation and event.listed_from is not None:
            alloc.started_by = Starter(event.agent_id, event.agent_incarnation, event.listed_from)
    return True


@_rule(TrialExited)
def _exited(view: TrialView, event: TrialExited, recorded: RecordedEvent) -> bool:
    alloc = view.allocations.get(event.allocation_id)
    if alloc is not None and not alloc.exited:  # the first exit is the run's end
        alloc.exited = True
        alloc.outcome, alloc.exit_code = event.outcome, event.exit_code
        alloc.ended_at = alloc.ended_at or recorded.recorded_at
    return True


@_rule(SlotsReleased)
def _released(view: TrialView, event: SlotsReleased, recorded: RecordedEvent) -> bool:
    alloc = view.allocations.get(event.allocation_id)
    if alloc is not None:
        alloc.released = True
        alloc.ended_at = alloc.ended_at or recorded.recorded_at
    return True


@_rule(PreemptionRequested)
def _preemption(view: TrialView, event: PreemptionRequested, _recorded: RecordedEvent) -> bool:
    alloc = view.allocations.get(event.allocation_id)
    if alloc is not None:
        alloc.preemption = event.reason
    return True


@_rule(KillRequested)
def _kill(view: TrialView, event: KillRequested, _recorded: RecordedEvent) -> bool:
    alloc = view.allocations.get(event.allocation_id)
    if alloc is not None:
        alloc.kill = True
    return True


@_rule(CheckpointSaved)
def _checkpoint(view: TrialView, event: CheckpointSaved, _recorded: RecordedEvent) -> bool:
    view.latest_checkpoint = event
    return True


@_rule(TrialEarlyExited)
def _early_exit(view: TrialView, event: TrialEarlyExited, _recorded: RecordedEvent) -> bool:
    view.early_exit = event.reason
    return True


@_rule(TrialRestarted)
def _restarted(view: TrialView, event: TrialRestarted, _recorded: RecordedEvent) -> bool:
    view.restarts = event.restarts
    view.run = None
    return True


@_rule(TrialStopRequested)
def _stop(view: TrialView, _event: TrialStopRequested, _recorded: RecordedEvent) -> bool:
    view.stop_requested = True
    return True


@_rule(TrialKillRequested)
def _kill_trial(view: TrialView, _event: TrialKillRequested, _recorded: RecordedEvent) -> bool:
    view.kill_requested = view.kill_pending = True
    return True


assert set(_RULES) == set(TRIAL_FACTS), "every trial fact has its rule"
