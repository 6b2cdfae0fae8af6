"""The scheduler's view of the cluster, folded from the log.

Pure: the state depends only on the events applied, in order. Decisions the scheduler made
earlier come back as events and are folded like any other fact, so a restarted scheduler that
replays the log reaches the same state and does not decide anything twice.

The state also knows the version of every stream the scheduler decides on (:data:`STREAMS`):
it receives every event of those streams, the ones it does not fold as bare envelopes, and a
decision is appended with the version its plan saw, so a plan made stale by another writer
loses instead of landing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from events.domain import lifecycle
from events.domain.types import (
    AgentLeaving,
    AgentLost,
    AgentRegistered,
    CheckpointSaved,
    ExperimentContinued,
    ExperimentResourcesChanged,
    ExperimentStateChanged,
    ExperimentSubmitted,
    KillRequested,
    PreemptionRequested,
    SlotsAllocated,
    SlotsDisabled,
    SlotsEnabled,
    TrialEarlyExited,
    TrialExited,
    TrialKillRequested,
    TrialRequested,
    TrialRestarted,
    TrialStarted,
    TrialStateChanged,
    TrialStopRequested,
)
from events.log.envelope import Event, RecordedEvent

STREAMS = frozenset({"trial", "experiment", "agent"})
"""The stream types the scheduler appends its decisions to."""

TYPES = frozenset(
    {
        "ExperimentSubmitted",
        "ExperimentStateChanged",
        "ExperimentResourcesChanged",
        "ExperimentContinued",
        "TrialRequested",
        "TrialStopRequested",
        "SlotsAllocated",
        "TrialStarted",
        "CheckpointSaved",
        "TrialEarlyExited",
        "TrialExited",
        "SlotsReleased",
        "PreemptionRequested",
        "KillRequested",
        "TrialRestarted",
        "TrialStateChanged",
        "AgentRegistered",
        "AgentLeaving",
        "AgentLost",
        "TrialKillRequested",
        "SlotsDisabled",
        "SlotsEnabled",
    }
)


@dataclass(frozen=True)
class Starter:
    """The agent process that started a run, and the first of its heartbeats that lists it."""

    agent_id: str
    incarnation: str
    listed_from: int


@dataclass
class Run:
    """The current allocation of a trial."""

    allocation_id: str
    run_id: int
    placements: dict[str, list[str]]
    order: int
    started: bool = False
    started_by: Starter | None = None
    preemption: str | None = None
    killing: bool = False
    exited: str | None = None


@dataclass
class Trial:
    """What the scheduler knows of one trial."""

    trial_id: int
    experiment_id: int
    order: int
    state: str = lifecycle.ACTIVE
    run_id: int = 0
    run: Run | None = None
    restarts: int = 0
    latest_checkpoint: str | None = None
    stop_requested: bool = False
    kill_requested: bool = False
    early_exit: str | None = None
    requeue: bool = False

    @property
    def live(self) -> bool:
        """Not yet ended (a trial in a state of ``lifecycle.ENDED`` never runs again)."""
        return self.state not in lifecycle.ENDED

    @property
    def running(self) -> bool:
        """Holds slots (allocated and not yet exited)."""
        return self.run is not None and self.run.exited is None


@dataclass
class Experiment:
    """An experiment's scheduling parameters and state."""

    experiment_id: int
    state: str
    slots_per_trial: int = 1
    priority: int = 42
    weight: float = 1.0
    max_slots: int | None = None
    pool: str = ""
    max_restarts: int = 5
    trials: list[int] = field(default_factory=list)


@dataclass
class AgentInfo:
    """A registered agent (``leaving``: its process announced its shutdown, see
    :meth:`placeable`)."""

    agent_id: str
    pool: str
    slots: list[str]
    lost: bool = False
    registered_position: int = 0
    incarnation: str = ""
    leaving: bool = False
    disabled: dict[str, bool] = field(default_factory=dict)
    """Disabled slot ids -> drain (let running work finish); survives re-registration."""

    @property
    def placeable(self) -> bool:
        """Whether new work may go to this agent: not lost, and its process is not leaving.

        A leaving agent is still registered (it is stopping its runs and reporting their
        exits), but whatever were placed on it now would never start and would be lost when it
        registers anew, so nothing is until then.
        """
        return not self.lost and not self.leaving

    def usable_slots(self) -> list[str]:
        """The slots new work may be placed on."""
        return [s for s in self.slots if s not in self.disabled]

    def evicting(self, slot_ids: list[str]) -> bool:
        """Whether any of ``slot_ids`` is disabled without drain (its runs are to be preempted)."""
        return any(self.disabled.get(s) is False for s in slot_ids)


@dataclass
class ClusterState:
    """Experiments, trials and agents as of ``position``, and the version of each stream seen."""

    experiments: dict[int, Experiment] = field(default_factory=dict)
    trials: dict[int, Trial] = field(default_factory=dict)
    agents: dict[str, AgentInfo] = field(default_factory=dict)
    position: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    allocations: dict[str, int] = field(default_factory=dict)
    """Allocation id -> its trial, for every allocation ever made (ids are read, not parsed)."""
    unmanaged: set[int] = field(default_factory=set)
    """Unmanaged experiments: their script opens and closes its runs through the API, holding
    no slots, so the scheduler never folds them or their trials."""

    def apply(self, event: RecordedEvent) -> None:
        """Folds one event (or the bare envelope of one on a stream in :data:`STREAMS`)."""
        self.position = event.position
        self.versions[event.stream_id] = event.stream_version
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, event.decode(), event.position)

    def version(self, stream_id: str) -> int:
        """The version of ``stream_id`` as of ``position`` (0: no event on it yet)."""
        return self.versions.get(stream_id, 0)

    def run_of(self, allocation_id: str) -> tuple[Trial, Run] | None:
        """The trial and run of ``allocation_id`` if it is the trial's current run."""
        trial_id = self.allocations.get(allocation_id)
        trial = self.trials.get(trial_id) if trial_id is not None else None
        if trial is None or trial.run is None or trial.run.allocation_id != allocation_id:
            return None
        return trial, trial.run


def _resources(config: dict[str, Any]) -> dict[str, Any]:
    res = config.get("resources") or {}
    return res if isinstance(res, dict) else {}


_Handler = Callable[[ClusterState, Any, int], None]
_HANDLERS: dict[str, _Handler] = {}
"""Event type -> its handler; every handler gets the event decoded into its model."""

E = TypeVar("E", bound=Event)


def _handles(model: type[E]) -> Callable[[Callable[[ClusterState, E, int], None]], _Handler]:
    """Registers the decorated function as the handler of ``model``'s events.

    Sound because :meth:`RecordedEvent.decode` of an event of type ``model.event_type`` returns
    a ``model``.
    """

    def register(handler: Callable[[ClusterState, E, int], None]) -> _Handler:
        _HANDLERS[model.event_type] = handler
        return handler

    return register


@_handles(ExperimentSubmitted)
def _submitted(s: ClusterState, e: ExperimentSubmitted, _pos: int) -> None:
    if e.unmanaged:
        s.unmanaged.add(e.experiment_id)
        return
    config = e.config
    res = _resources(config)
    priority = res.get("priority")
    s.experiments[e.experiment_id] = Experiment(
        experiment_id=e.experiment_id,
        state=lifecycle.initial_experiment_state(e.activate),
        slots_per_trial=int(res.get("slots_per_trial") or 1),
        priority=int(priority) if priority is not None else 42,
        weight=float(res.get("weight") or 1.0),
        max_slots=res.get("max_slots"),
        pool=str(res.get("resource_pool") or ""),
        max_restarts=int(
            config.get("max_restarts", 5) if config.get("max_restarts") is not None else 5
        ),
    )


@_handles(ExperimentStateChanged)
def _experiment_state(s: ClusterState, e: ExperimentStateChanged, _pos: int) -> None:
    exp = s.experiments.get(e.experiment_id)
    if exp is None:
        return
    after = lifecycle.next_experiment_state(exp.state, e.state)
    if after is not None:  # a change the state machine refuses is never applied
        exp.state = after


@_handles(ExperimentResourcesChanged)
def _resources_changed(s: ClusterState, e: ExperimentResourcesChanged, _pos: int) -> None:
    exp = s.experiments.get(e.experiment_id)
    if exp is None:
        return
    changes = e.resources  # only the fields that changed
    if "priority" in changes:
        priority = changes["priority"]
        exp.priority = int(priority) if priority is not None else 42
    if "weight" in changes:
        exp.weight = float(changes["weight"] or 1.0)
    if "max_slots" in changes:
        max_slots = changes["max_slots"]
        exp.max_slots = int(max_slots) if max_slots is not None else None


@_handles(ExperimentContinued)
def _continued(s: ClusterState, e: ExperimentContinued, _pos: int) -> None:
    """An ended experiment is ACTIVE again and each continued trial starts over as a fresh
    request would (no stop, kill or early exit pending, its restart budget whole)."""
    exp = s.experiments.get(e.experiment_id)
    if exp is None or not lifecycle.can_continue(exp.state):
        return
    exp.state = lifecycle.ACTIVE
    max_restarts = e.config.get("max_restarts")
    if max_restarts is not None:
        exp.max_restarts = int(max_restarts)
    for continued in e.trials:
        trial = s.trials.get(continued.trial_id)
        if trial is not None:
            trial.stop_requested = False
            trial.kill_requested = False
            trial.early_exit = None
            trial.restarts = 0


@_handles(TrialRequested)
def _requested(s: ClusterState, e: TrialRequested, pos: int) -> None:
    if e.experiment_id in s.unmanaged:
        return
    trial = Trial(trial_id=e.trial_id, experiment_id=e.experiment_id, order=pos)
    trial.latest_checkpoint = e.warm_start_checkpoint  # a clone starts from its parent's
    s.trials[trial.trial_id] = trial
    exp = s.experiments.get(e.experiment_id)
    if exp is not None:
        exp.trials.append(trial.trial_id)


@_handles(TrialStopRequested)
def _stop_requested(s: ClusterState, e: TrialStopRequested, _pos: int) -> None:
    trial = s.trials.get(e.trial_id)
    if trial is not None:
        trial.stop_requested = True


@_handles(SlotsAllocated)
def _allocated(s: ClusterState, e: SlotsAllocated, pos: int) -> None:
    trial = s.trials.get(e.trial_id)
    if trial is None:
        return
    # A payload stored without run_id (before runs were numbered) is the trial's next run,
    # not the model's default of 1.
    trial.run_id = e.run_id if "run_id" in e.model_fields_set else trial.run_id + 1
    trial.run = Run(e.allocation_id, trial.run_id, dict(e.placements), order=pos)
    s.allocations[trial.run.allocation_id] = trial.trial_id
    trial.requeue = False


@_handles(TrialStarted)
def _started(s: ClusterState, e: TrialStarted, _pos: int) -> None:
    found = s.run_of(e.allocation_id)
    if found is None:
        return
    run = found[1]
    run.started = True
    if e.agent_incarnation and e.listed_from is not None:
        run.started_by = Starter(e.agent_id, e.agent_incarnation, e.listed_from)


@_handles(CheckpointSaved)
def _checkpoint(s: ClusterState, e: CheckpointSaved, _pos: int) -> None:
    trial = s.trials.get(e.trial_id)
    if trial is not None:
        trial.latest_checkpoint = e.uuid


@_handles(TrialEarlyExited)
def _early_exit(s: ClusterState, e: TrialEarlyExited, _pos: int) -> None:
    trial = s.trials.get(e.trial_id)
    if trial is not None:
        trial.early_exit = e.reason


@_handles(TrialExited)
def _exited(s: ClusterState, e: TrialExited, _pos: int) -> None:
    found = s.run_of(e.allocation_id)
    if found is not None and found[1].exited is None:
        found[1].exited = e.outcome


@_handles(PreemptionRequested)
def _preemption(s: ClusterState, e: PreemptionRequested, _pos: int) -> None:
    found = s.run_of(e.allocation_id)
    if found is not None:
        found[1].preemption = e.reason


@_handles(KillRequested)
def _kill(s: ClusterState, e: KillRequested, _pos: int) -> None:
    found = s.run_of(e.allocation_id)
    if found is not None:
        found[1].killing = True


@_handles(TrialRestarted)
def _restarted(s: ClusterState, e: TrialRestarted, _pos: int) -> None:
    trial = s.trials.get(e.trial_id)
    if trial is not None:
        trial.restarts = e.restarts
        trial.run = None


@_handles(TrialStateChanged)
def _trial_state(s: ClusterState, e: TrialStateChanged, _pos: int) -> None:
    trial = s.trials.get(e.trial_id)
    if trial is None:
        return
    after = lifecycle.next_trial_state(trial.state, e.state)
    if after is None:  # refused by the state machine: nothing of it is applied
        return
    trial.state = after
    if e.reason == "requeue":
        trial.run = None
        trial.requeue = True
    elif trial.run is not None and trial.run.exited is not None:
        trial.run = None


@_handles(AgentRegistered)
def _agent_registered(s: ClusterState, e: AgentRegistered, pos: int) -> None:
    before = s.agents.get(e.agent_id)
    # A payload stored without a pool counts as the pool "" (as before decoding), not the
    # model's default.
    pool = e.resource_pool if "resource_pool" in e.model_fields_set else ""
    s.agents[e.agent_id] = AgentInfo(
        agent_id=e.agent_id,
        pool=pool,
        slots=[slot.slot_id for slot in e.slots],
        registered_position=pos,
        incarnation=e.incarnation,
        disabled=dict(before.disabled) if before is not None else {},
    )


@_handles(AgentLeaving)
def _agent_leaving(s: ClusterState, e: AgentLeaving, _pos: int) -> None:
    """Only the registered process's announcement counts (an older one's, late, does not)."""
    agent = s.agents.get(e.agent_id)
    if agent is not None and agent.incarnation == e.incarnation:
        agent.leaving = True


def _agent_of(s: ClusterState, agent_id: str) -> AgentInfo:
    agent = s.agents.get(agent_id)
    if agent is None:  # disabled before it ever registered: remember for when it does
        agent = s.agents[agent_id] = AgentInfo(agent_id=agent_id, pool="", slots=[], lost=True)
    return agent


@_handles(SlotsDisabled)
def _slots_disabled(s: ClusterState, e: SlotsDisabled, _pos: int) -> None:
    agent = _agent_of(s, e.agent_id)
    for slot_id in e.slot_ids or agent.slots:
        agent.disabled[slot_id] = e.drain


@_handles(SlotsEnabled)
def _slots_enabled(s: ClusterState, e: SlotsEnabled, _pos: int) -> None:
    agent = _agent_of(s, e.agent_id)
    if not e.slot_ids:
        agent.disabled.clear()
    for slot_id in e.slot_ids:
        agent.disabled.pop(slot_id, None)


@_handles(TrialKillRequested)
def _kill_requested(s: ClusterState, e: TrialKillRequested, _pos: int) -> None:
    trial = s.trials.get(e.trial_id)
    if trial is not None:
        trial.kill_requested = True


@_handles(AgentLost)
def _agent_lost(s: ClusterState, e: AgentLost, _pos: int) -> None:
    agent = s.agents.get(e.agent_id)
    if agent is not None:
        agent.lost = True
