"""The whole cluster folded: every managed experiment, trial, task and agent, and the links
between them, each aggregate by its own fold.

The scheduler plans on a :class:`Cluster` (adding only its own bookkeeping); the API answers
the agent list and "the cluster as it was at position p" from one. Cross-aggregate facts are
applied here: a ``TrialRequested`` on an experiment's stream creates the trial, an
``ExperimentContinued`` the experiment's fold accepts restarts each continued trial.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from events.domain.aggregates.agent import AGENT_FACTS, AgentView, apply_agent
from events.domain.aggregates.common import iso
from events.domain.aggregates.experiment import (
    EXPERIMENT_FACTS,
    ExperimentFact,
    ExperimentView,
    apply_experiment,
)
from events.domain.aggregates.task import TASK_FACTS, TaskView, apply_task
from events.domain.aggregates.trial import TRIAL_FACTS, AllocationView, TrialView, apply_trial
from events.domain.names import agent_of_stream, task_of_stream
from events.domain.types import (
    ExperimentContinued,
    ExperimentSubmitted,
    SlotsAllocated,
    SlotsReleased,
    TaskAllocated,
    TaskExited,
    TrialRequested,
)
from events.log.envelope import Event, RecordedEvent

CLUSTER_FACTS = (
    *AGENT_FACTS,
    "SlotsAllocated",
    "SlotsReleased",
    "TaskRequested",
    "TaskAllocated",
    "TaskExited",
)
"""What :func:`fold_cluster` needs for the agent list (agent streams, and the slot use)."""

_EXPERIMENT, _TRIAL, _AGENT, _TASK = "experiment", "trial", "agent", "task"
_AGGREGATE = {
    **dict.fromkeys(EXPERIMENT_FACTS, _EXPERIMENT),
    **dict.fromkeys(TRIAL_FACTS, _TRIAL),
    **dict.fromkeys(AGENT_FACTS, _AGENT),
    **dict.fromkeys(TASK_FACTS, _TASK),
}
"""Event type -> the aggregate whose fold applies it."""
_SLOT_USE = frozenset(("SlotsAllocated", "SlotsReleased"))

CLUSTER_TYPES = frozenset(_AGGREGATE)
"""Every type :meth:`Cluster.apply` folds."""


@dataclass(slots=True)
class Cluster:
    """Experiments, trials, tasks and agents as of ``position``.

    Unmanaged experiments (their script opens and closes its runs through the API, holding no
    slots) and their trials are not folded here.
    """

    experiments: dict[int, ExperimentView] = field(default_factory=dict)
    trials: dict[int, TrialView] = field(default_factory=dict)
    agents: dict[str, AgentView] = field(default_factory=dict)
    tasks: dict[str, TaskView] = field(default_factory=dict)
    position: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    """Stream id -> its version as of ``position`` (a decider appends with the version it saw)."""
    allocations: dict[str, int] = field(default_factory=dict)
    """Allocation id -> its trial, for every allocation ever made (ids are read, not parsed)."""
    slot_use: dict[tuple[str, str], str] = field(default_factory=dict)
    """(agent id, slot id) -> the allocation holding it, from allocation until release."""
    unmanaged: set[int] = field(default_factory=set)

    def apply(self, recorded: RecordedEvent, event: Event | None = None) -> None:
        """Folds one event (``event``: ``recorded`` already decoded); other types only move
        ``position`` and their stream's version.

        An event at or before ``position`` was folded already and is skipped: a consumer that
        reads a page of the log again (after its transaction lost an append race, say) need not
        fold anew; the events it folded are facts all the same.
        """
        if recorded.position <= self.position:
            return
        self.position = recorded.position
        self.versions[recorded.stream_id] = recorded.stream_version
        aggregate = _AGGREGATE.get(recorded.type)
        if aggregate is None:
            return
        if event is None:
            event = recorded.decode()
        if aggregate is _TRIAL:  # the hot path: most of a log is trial facts
            if recorded.type in _SLOT_USE:
                self._slot_use(event)  # type: ignore[arg-type]  # by _SLOT_USE
            trial = self.trials.get(event.trial_id)  # type: ignore[attr-defined]  # trial facts name it
            if trial is not None:
                apply_trial(trial, recorded, event)
                if isinstance(event, SlotsAllocated):
                    self.allocations[event.allocation_id] = trial.trial_id
        elif aggregate is _EXPERIMENT:
            self._experiment_fact(recorded, event)
        elif aggregate is _TASK:
            task_id = task_of_stream(recorded.stream_id)
            if task_id is not None:
                self._task_fact(task_id, recorded, event)
        else:
            self._agent_fact(recorded, event)

    def _agent_fact(self, recorded: RecordedEvent, event: Event) -> None:
        agent_id = agent_of_stream(recorded.stream_id)
        if agent_id is None:
            return
        agent = self.agents.get(agent_id)
        if agent is None:
            agent = self.agents[agent_id] = AgentView(agent_id)
        apply_agent(agent, recorded, event)

    def _experiment_fact(self, recorded: RecordedEvent, event: Event) -> None:
        assert isinstance(event, ExperimentFact)
        experiment_id = event.experiment_id
        if experiment_id in self.unmanaged:
            return
        if isinstance(event, ExperimentSubmitted) and event.unmanaged:
            self.unmanaged.add(experiment_id)
            return
        exp = self.experiments.get(experiment_id)
        if exp is None and isinstance(event, ExperimentSubmitted):
            exp = self.experiments[experiment_id] = ExperimentView(experiment_id)
        applied = exp is not None and apply_experiment(exp, recorded, event)
        if isinstance(event, TrialRequested):
            self.trials[event.trial_id] = TrialView(
                event.trial_id,
                experiment_id=experiment_id,
                requested_position=recorded.position,
                warm_start=event.warm_start_checkpoint,
            )
        elif isinstance(event, ExperimentContinued) and applied:
            for continued in event.trials:
                trial = self.trials.get(continued.trial_id)
                if trial is not None:
                    trial.continued()

    def _task_fact(self, task_id: str, recorded: RecordedEvent, event: Event) -> None:
        task = self.tasks.get(task_id)
        if task is None:
            task = self.tasks[task_id] = TaskView(task_id)
        held = task.allocated
        apply_task(task, recorded, event)
        if task.allocation_id is None:
            return
        if isinstance(event, TaskAllocated) and task.allocation_id == event.allocation_id:
            self._use(task.allocation_id, task.placements, hold=True)
        elif isinstance(event, TaskExited) and held:
            self._use(task.allocation_id, task.placements, hold=False)

    def _slot_use(self, event: SlotsAllocated | SlotsReleased) -> None:
        self._use(event.allocation_id, event.placements, hold=isinstance(event, SlotsAllocated))

    def _use(self, allocation_id: str, placements: dict[str, list[str]], *, hold: bool) -> None:
        for agent_id, slot_ids in placements.items():
            for slot_id in slot_ids:
                key = (agent_id, slot_id)
                if hold:
                    self.slot_use[key] = allocation_id
                elif self.slot_use.get(key) == allocation_id:
                    del self.slot_use[key]

    def version(self, stream_id: str) -> int:
        """The version of ``stream_id`` as of ``position`` (0: no event on it yet)."""
        return self.versions.get(stream_id, 0)

    def run_of(self, allocation_id: str) -> tuple[TrialView, AllocationView] | None:
        """The trial and run of ``allocation_id`` if it is the trial's current run."""
        trial_id = self.allocations.get(allocation_id)
        trial = self.trials.get(trial_id) if trial_id is not None else None
        if trial is None or trial.run is None or trial.run.allocation_id != allocation_id:
            return None
        return trial, trial.run

    def agent_list(self) -> list[dict[str, Any]]:
        """The agents as ``GET /api/v1/agents`` lists them, by agent id (no heartbeats: those
        are not facts of the log)."""
        return [
            describe_agent(self.agents[agent_id], self.slot_use)
            for agent_id in sorted(self.agents)
            if self.agents[agent_id].registration is not None
        ]


def describe_agent(agent: AgentView, slot_use: dict[tuple[str, str], str]) -> dict[str, Any]:
    """One registered agent as the agent list shows it."""
    registration = agent.registration
    assert registration is not None
    slots = [
        {
            "agent_id": agent.agent_id,
            "slot_id": slot.slot_id,
            "device": slot.device,
            "name": slot.name,
            "enabled": slot.slot_id not in agent.disabled,
            "draining": agent.disabled.get(slot.slot_id) is True,
            "allocation_id": slot_use.get((agent.agent_id, slot.slot_id)),
        }
        for slot in sorted(registration.slots, key=lambda s: s.slot_id)
    ]
    return {
        "agent_id": agent.agent_id,
        "resource_pool": registration.resource_pool,
        "hostname": registration.hostname,
        "state": "lost" if agent.lost else "active",
        "registered_at": iso(agent.registered_at),
        "lost_at": iso(agent.lost_at),
        "last_heartbeat": None,
        "slots": slots,
        "enabled": any(s["enabled"] for s in slots),
    }


def fold_cluster(events: Iterable[RecordedEvent]) -> Cluster:
    """Folds a read of the log (e.g. of :data:`CLUSTER_FACTS` for the agent list)."""
    view = Cluster()
    for recorded in events:
        view.apply(recorded)
    return view
