"""Pure folds of cairn's aggregates: experiment, trial (with its allocations), agent and cluster.

Each fold takes recorded events (upcast at the read boundary by
:func:`events.log.store.row_to_event`), decodes them into their current models and returns a plain
state object. Folds read no clock, RNG or database, so the state at any position of the log is
the fold of the events up to it: the API answers both "now" and "as it was at position p" with
the same code. State changes go through :mod:`events.domain.lifecycle`'s rules, as in every other fold
of a state: a change the state machine refuses is skipped, never applied (``lifecycle.fold_*``
folds the state alone and also lists the refused changes).

The event types each fold reads are listed beside it (``*_FACTS``), so a reader can fetch only
those; a fold ignores any other type it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events.domain import lifecycle
from events.domain.config.secrets import mask_secrets
from events.domain.names import agent_of_stream
from events.domain.types import (
    AgentLeaving,
    AgentLost,
    AgentRegistered,
    CheckpointSaved,
    ExperimentArchived,
    ExperimentContinued,
    ExperimentDescribed,
    ExperimentLabelsChanged,
    ExperimentRenamed,
    ExperimentResourcesChanged,
    ExperimentStateChanged,
    ExperimentSubmitted,
    KillRequested,
    MetricsReported,
    PreemptionRequested,
    SlotsAllocated,
    SlotsDisabled,
    SlotsEnabled,
    SlotsReleased,
    TrialEarlyExited,
    TrialExited,
    TrialRequested,
    TrialRestarted,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.envelope import RecordedEvent

EXPERIMENT_FACTS = (
    "ExperimentSubmitted",
    "ExperimentStateChanged",
    "ExperimentArchived",
    "ExperimentRenamed",
    "ExperimentDescribed",
    "ExperimentLabelsChanged",
    "ExperimentResourcesChanged",
    "ExperimentContinued",
    "TrialRequested",
)
"""What :func:`fold_experiment` reads (``TrialRequested`` last: leave it out for state only)."""

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
)
"""What :func:`fold_trial` reads."""

TRIAL_SUMMARY_FACTS = (
    *TRIAL_FACTS,
    "TrialRestarted",
    "WorkloadCompleted",
    "ValidationReported",
    "MetricsReported",
)
"""What :func:`fold_trial_summary` reads."""

AGENT_FACTS = ("AgentRegistered", "AgentLeaving", "AgentLost", "SlotsDisabled", "SlotsEnabled")
"""What :func:`fold_agent` reads."""

CLUSTER_FACTS = (*AGENT_FACTS, "SlotsAllocated", "SlotsReleased")
"""What :func:`fold_cluster` reads (agent streams, and trial streams for slot use)."""


def iso(value: datetime | None) -> str | None:
    """An ISO 8601 timestamp, or ``None``."""
    return value.isoformat() if value is not None else None


# --- experiment -----------------------------------------------------------------------------


@dataclass
class ExperimentView:
    """An experiment's stream folded: config, owner, state, requested trials."""

    experiment_id: int
    version: int = 0
    submitted: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    code_ref: str | None = None
    warnings: list[dict[str, str]] = field(default_factory=list)
    owner: str = ""
    state: str = lifecycle.ACTIVE
    archived: bool = False
    unmanaged: bool = False
    external_id: str | None = None
    submitted_at: datetime | None = None
    submitted_position: int | None = None
    ended_at: datetime | None = None
    trials: dict[int, TrialRequested] = field(default_factory=dict)
    requested_at: dict[int, datetime] = field(default_factory=dict)

    @property
    def exists(self) -> bool:
        """Whether the experiment was submitted."""
        return self.submitted

    @property
    def searcher(self) -> dict[str, Any]:
        """The config's ``searcher`` section (empty when absent)."""
        searcher = self.config.get("searcher")
        return searcher if isinstance(searcher, dict) else {}

    @property
    def resources(self) -> dict[str, Any]:
        """The config's ``resources`` section (empty when absent)."""
        resources = self.config.get("resources")
        return resources if isinstance(resources, dict) else {}

    @property
    def smaller_is_better(self) -> bool:
        """Whether a smaller searcher metric is better (the searcher's default: yes)."""
        return bool(self.searcher.get("smaller_is_better", True))

    def requested_trial(self, trial_id: int, state: str = lifecycle.ACTIVE) -> dict[str, Any]:
        """A trial summary from its ``TrialRequested`` alone (before the projection has it)."""
        requested = self.trials[trial_id]
        return {
            "trial_id": trial_id,
            "experiment_id": self.experiment_id,
            "seq": requested.seq,
            "state": state,
            "hparams": requested.hparams,
            "trial_seed": requested.trial_seed,
            "run_id": 0,
            "restarts": 0,
            "steps_completed": 0,
            "latest_checkpoint": None,
            "best_metric": None,
            "latest_validation": None,
            "requested_at": iso(self.requested_at.get(trial_id)),
            "started_at": None,
            "ended_at": None,
        }

    def describe(self) -> dict[str, Any]:
        """The experiment as ``GET /api/v1/experiments/{id}`` shows it (secrets masked)."""
        labels = self.config.get("labels")
        return {
            "id": self.experiment_id,
            "state": self.state,
            "owner": self.owner,
            "code_ref": self.code_ref,
            "config": mask_secrets(self.config),
            "warnings": self.warnings,
            "name": self.config.get("name"),
            "description": self.config.get("description"),
            "labels": labels if isinstance(labels, list) else [],
            "priority": self.resources.get("priority"),
            "weight": self.resources.get("weight"),
            "max_slots": self.resources.get("max_slots"),
            "archived": self.archived,
            "unmanaged": self.unmanaged,
            "external_id": self.external_id,
            "num_trials": len(self.trials),
            "searcher_metric": self.searcher.get("metric"),
            "smaller_is_better": self.smaller_is_better,
            "submitted_at": iso(self.submitted_at),
            "submitted_position": self.submitted_position,
            "ended_at": iso(self.ended_at),
            "trials": [
                {
                    "trial_id": t.trial_id,
                    "seq": t.seq,
                    "hparams": t.hparams,
                    "trial_seed": t.trial_seed,
                }
                for t in self.trials.values()
            ],
        }


SettingsChange = (
    ExperimentRenamed | ExperimentDescribed | ExperimentLabelsChanged | ExperimentResourcesChanged
)
"""A user's change of an experiment's name, description, labels or resources."""


def fold_experiment(experiment_id: int, events: Iterable[RecordedEvent]) -> ExperimentView:
    """Folds an experiment's stream."""
    view = ExperimentView(experiment_id)
    for recorded in events:
        apply_experiment(view, recorded)
    return view


def apply_experiment(view: ExperimentView, recorded: RecordedEvent) -> None:
    """Applies one experiment event to ``view`` in place."""
    view.version = max(view.version, recorded.stream_version)
    if recorded.type not in EXPERIMENT_FACTS:
        return
    event = recorded.decode()
    if isinstance(event, ExperimentSubmitted):
        view.submitted = True
        view.config = event.config
        view.code_ref = event.code_ref
        view.warnings = [w.model_dump() for w in event.warnings]
        view.owner = event.owner
        view.unmanaged = event.unmanaged
        view.external_id = event.external_id
        view.state = lifecycle.initial_experiment_state(event.activate)
        view.submitted_at = recorded.recorded_at
        view.submitted_position = recorded.position
    elif isinstance(event, ExperimentStateChanged):
        after = lifecycle.next_experiment_state(view.state, event.state)
        if after is None:
            return
        view.state = after
        if after in lifecycle.TERMINAL:
            view.ended_at = recorded.recorded_at
    elif isinstance(event, ExperimentArchived):
        view.archived = event.archived
    elif isinstance(event, SettingsChange):
        view.config = apply_settings(view.config, event)
    elif isinstance(event, ExperimentContinued):
        if lifecycle.can_continue(view.state):
            view.state = lifecycle.ACTIVE
            view.ended_at = None
            view.config = dict(event.config)
            for continued in event.trials:
                requested = view.trials.get(continued.trial_id)
                if requested is not None:
                    view.trials[continued.trial_id] = requested.model_copy(
                        update={"hparams": dict(continued.hparams)}
                    )
    elif isinstance(event, TrialRequested):
        view.trials[event.trial_id] = event
        view.requested_at[event.trial_id] = recorded.recorded_at


def apply_settings(config: dict[str, Any], event: SettingsChange) -> dict[str, Any]:
    """The config with a user's change of name, description, labels or resources applied (a
    new dict; ``config`` is left as it is)."""
    out = dict(config)
    if isinstance(event, ExperimentRenamed):
        out["name"] = event.name
    elif isinstance(event, ExperimentDescribed):
        out["description"] = event.description
    elif isinstance(event, ExperimentLabelsChanged):
        out["labels"] = list(event.labels)
    else:
        resources = out.get("resources")
        out["resources"] = {**(resources if isinstance(resources, dict) else {})}
        out["resources"].update(event.resources)
    return out


# --- trial and its allocations --------------------------------------------------------------


@dataclass
class AllocationView:
    """One run of a trial on its slots."""

    allocation_id: str
    run_id: int
    placements: dict[str, list[str]]
    started: bool = False
    exited: bool = False
    preempt: bool = False
    kill: bool = False
    released: bool = False
    outcome: str | None = None
    exit_code: int | None = None
    agent_id: str | None = None
    allocated_at: datetime | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None

    @property
    def state(self) -> str:
        """``ASSIGNED``, ``RUNNING`` once started, ``TERMINATED`` once exited or released."""
        if self.exited or self.released:
            return "TERMINATED"
        return "RUNNING" if self.started else "ASSIGNED"


@dataclass
class TrialView:
    """A trial's stream folded: its allocations, latest checkpoint and state."""

    trial_id: int
    version: int = 0
    allocations: dict[str, AllocationView] = field(default_factory=dict)
    latest_allocation: str | None = None
    latest_checkpoint: CheckpointSaved | None = None
    state: str = lifecycle.ACTIVE
    early_exited: bool = False

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


def apply_trial(view: TrialView, recorded: RecordedEvent) -> None:
    """Applies one trial event to ``view`` in place (for incremental polling)."""
    view.version = max(view.version, recorded.stream_version)
    if recorded.type not in TRIAL_FACTS:
        return
    event = recorded.decode()
    if isinstance(event, SlotsAllocated):
        view.allocations[event.allocation_id] = AllocationView(
            event.allocation_id,
            event.run_id,
            dict(event.placements),
            allocated_at=recorded.recorded_at,
        )
        view.latest_allocation = event.allocation_id
        return
    alloc_id = getattr(event, "allocation_id", None)
    alloc = view.allocations.get(alloc_id) if isinstance(alloc_id, str) else None
    if isinstance(event, TrialStarted) and alloc is not None:
        alloc.started = True
        alloc.started_at = alloc.started_at or recorded.recorded_at
        alloc.agent_id = alloc.agent_id or event.agent_id
    elif isinstance(event, TrialExited) and alloc is not None:
        alloc.exited = True
        alloc.outcome, alloc.exit_code = event.outcome, event.exit_code
        alloc.ended_at = alloc.ended_at or recorded.recorded_at
    elif isinstance(event, SlotsReleased) and alloc is not None:
        alloc.released = True
        alloc.ended_at = alloc.ended_at or recorded.recorded_at
    elif isinstance(event, PreemptionRequested) and alloc is not None:
        alloc.preempt = True
    elif isinstance(event, KillRequested) and alloc is not None:
        alloc.kill = True
    elif isinstance(event, CheckpointSaved):
        view.latest_checkpoint = event
    elif isinstance(event, TrialStateChanged):
        view.state = lifecycle.next_trial_state(view.state, event.state) or view.state
    elif isinstance(event, TrialEarlyExited):
        view.early_exited = True


def metric_value(metrics: Mapping[str, Any], name: str | None) -> float | None:
    """The finite numeric value of metric ``name`` in ``metrics`` (``None`` if absent)."""
    if not name:
        return None
    value = metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def fold_trial_summary(
    experiment: ExperimentView, trial_id: int, events: Iterable[RecordedEvent]
) -> dict[str, Any]:
    """A trial as the trial list shows it (the shape of the tracker's ``tr_trials`` row),
    folded from its ``TrialRequested`` in ``experiment`` and its own stream's events.

    Steps completed follow Determined's rollback: a run reporting at step s while an earlier
    run had reported beyond s puts the trial back at s.
    """
    summary = experiment.requested_trial(trial_id)
    metric = experiment.searcher.get("metric")
    metric_name = metric if isinstance(metric, str) else None
    smaller = experiment.smaller_is_better
    state = lifecycle.ACTIVE
    run_steps: dict[int, int] = {}
    started_at: datetime | None = None
    ended_at: datetime | None = None
    for recorded in events:
        if recorded.type not in TRIAL_SUMMARY_FACTS:
            continue
        event = recorded.decode()
        if isinstance(event, SlotsAllocated):
            summary["run_id"] = max(summary["run_id"], event.run_id)
        elif isinstance(event, TrialStarted):
            started_at = started_at or recorded.recorded_at
            summary["run_id"] = max(summary["run_id"], event.run_id)
        elif isinstance(event, TrialRestarted):
            summary["restarts"] = event.restarts
        elif isinstance(event, CheckpointSaved):
            summary["latest_checkpoint"] = event.uuid
        elif isinstance(event, TrialStateChanged):
            after = lifecycle.next_trial_state(state, event.state)
            if after is not None and after != state:
                state = after
                ended_at = recorded.recorded_at if state in lifecycle.TERMINAL else None
        elif isinstance(event, WorkloadCompleted | ValidationReported | MetricsReported):
            steps = event.steps_completed
            rolled_back = any(s > steps for r, s in run_steps.items() if r < event.run_id)
            for run in [r for r in run_steps if r < event.run_id]:
                run_steps[run] = min(run_steps[run], steps)
            run_steps[event.run_id] = max(run_steps.get(event.run_id, steps), steps)
            summary["steps_completed"] = (
                steps if rolled_back else max(summary["steps_completed"], steps)
            )
            if isinstance(event, ValidationReported):
                summary["latest_validation"] = {
                    "run_id": event.run_id,
                    "steps_completed": event.steps_completed,
                    "metrics": dict(event.metrics),
                }
                value = metric_value(event.metrics, metric_name)
                best = summary["best_metric"]
                if value is not None and (
                    best is None or (value < best if smaller else value > best)
                ):
                    summary["best_metric"] = value
    summary["state"] = state
    summary["started_at"] = iso(started_at)
    summary["ended_at"] = iso(ended_at)
    return summary


# --- agent and cluster ----------------------------------------------------------------------


@dataclass
class AgentView:
    """An agent's stream folded: its latest registration, whether that process announced it is
    leaving or was lost since, and which of its slots users disabled (and of those, which
    drain)."""

    agent_id: str
    version: int = 0
    registration: AgentRegistered | None = None
    registered_at: datetime | None = None
    lost: bool = False
    lost_at: datetime | None = None
    leaving: bool = False
    disabled: set[str] = field(default_factory=set)
    draining: set[str] = field(default_factory=set)

    @property
    def registered(self) -> bool:
        """Whether the agent is registered and not lost since."""
        return self.registration is not None and not self.lost

    @property
    def slot_ids(self) -> list[str]:
        """The slot ids of the latest registration."""
        return [s.slot_id for s in self.registration.slots] if self.registration else []


def fold_agent(agent_id: str, events: Iterable[RecordedEvent]) -> AgentView:
    """Folds an agent's stream."""
    view = AgentView(agent_id)
    for recorded in events:
        apply_agent(view, recorded)
    return view


def apply_agent(view: AgentView, recorded: RecordedEvent) -> None:
    """Applies one agent event to ``view`` in place."""
    view.version = max(view.version, recorded.stream_version)
    if recorded.type not in AGENT_FACTS:
        return
    event = recorded.decode()
    if isinstance(event, AgentRegistered):
        view.registration = event
        view.registered_at = recorded.recorded_at
        view.lost = False
        view.lost_at = None
        view.leaving = False
    elif isinstance(event, AgentLeaving):
        # Only the registered process's announcement counts: an older one's, late, does not.
        registration = view.registration
        view.leaving = view.leaving or (
            registration is not None and registration.incarnation == event.incarnation
        )
    elif isinstance(event, AgentLost):
        view.lost = True
        view.lost_at = recorded.recorded_at
    elif isinstance(event, SlotsDisabled):
        slots = set(event.slot_ids or view.slot_ids)
        view.disabled |= slots
        view.draining = (view.draining | slots) if event.drain else (view.draining - slots)
    elif isinstance(event, SlotsEnabled):
        slots = set(event.slot_ids or view.slot_ids)
        view.disabled -= slots
        view.draining -= slots


@dataclass
class ClusterView:
    """Every agent, and which allocation holds each slot (agent id, slot id)."""

    agents: dict[str, AgentView] = field(default_factory=dict)
    slot_use: dict[tuple[str, str], str] = field(default_factory=dict)

    def agent_list(self) -> list[dict[str, Any]]:
        """The agents as ``GET /api/v1/agents`` lists them, by agent id (no heartbeats: those
        are not facts of the log)."""
        out = []
        for agent_id in sorted(self.agents):
            agent = self.agents[agent_id]
            if agent.registration is None:
                continue
            slots = [
                {
                    "agent_id": agent_id,
                    "slot_id": slot.slot_id,
                    "device": slot.device,
                    "name": slot.name,
                    "enabled": slot.slot_id not in agent.disabled,
                    "draining": slot.slot_id in agent.draining,
                    "allocation_id": self.slot_use.get((agent_id, slot.slot_id)),
                }
                for slot in sorted(agent.registration.slots, key=lambda s: s.slot_id)
            ]
            out.append(
                {
                    "agent_id": agent_id,
                    "resource_pool": agent.registration.resource_pool,
                    "hostname": agent.registration.hostname,
                    "state": "lost" if agent.lost else "active",
                    "registered_at": iso(agent.registered_at),
                    "lost_at": iso(agent.lost_at),
                    "last_heartbeat": None,
                    "slots": slots,
                    "enabled": any(s["enabled"] for s in slots),
                }
            )
        return out


def fold_cluster(events: Iterable[RecordedEvent]) -> ClusterView:
    """Folds every agent stream, and the slot allocations and releases on trial streams."""
    view = ClusterView()
    for recorded in events:
        agent_id = agent_of_stream(recorded.stream_id)
        if agent_id is not None:
            agent = view.agents.get(agent_id)
            if agent is None:
                agent = view.agents[agent_id] = AgentView(agent_id)
            apply_agent(agent, recorded)
        elif recorded.type in ("SlotsAllocated", "SlotsReleased"):
            event = recorded.decode()
            assert isinstance(event, SlotsAllocated | SlotsReleased)
            for agent_id, slot_ids in event.placements.items():
                for slot_id in slot_ids:
                    key = (agent_id, slot_id)
                    if isinstance(event, SlotsAllocated):
                        view.slot_use[key] = event.allocation_id
                    elif view.slot_use.get(key) == event.allocation_id:
                        del view.slot_use[key]
    return view
