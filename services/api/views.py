"""Read side of the gateway: fold experiment, trial and agent streams to answer queries.

The folds are pure (events in, state out). Loaders take the store (a plain read) or a
:class:`~events.store.Transaction` (to decide and append in one transaction). They read only the
event types their fold uses (a long trial's many ``WorkloadCompleted`` are never decoded), and
the stream's head version in the same statement, so an append with ``expected_version`` equal to
the view's version fails if anything at all was appended since.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from events import lifecycle
from events.config.secrets import mask_secrets
from events.db import Connection, translate_errors
from events.envelope import RecordedEvent
from events.names import (
    TrialIdError,
    experiment_stream,
    parse_allocation_id,
    parse_trial_id,
    trial_label,
    trial_stream,
)
from events.store import EventStore, Transaction, row_to_event
from events.types import (
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
    PreemptionRequested,
    SlotsAllocated,
    SlotsDisabled,
    SlotsEnabled,
    TrialEarlyExited,
    TrialExited,
    TrialKillRequested,
    TrialRequested,
    TrialStarted,
    TrialStateChanged,
)
from services.api.auth import Principal
from services.api.errors import forbidden, not_found

TERMINAL_STATES = frozenset({"COMPLETED", "CANCELED", "ERROR", "DELETING", "DELETED"})
MAX_ID = 2**63 - 1
"""Largest id a ``bigint`` column holds; larger ids in a path are simply unknown (404)."""


Reader = EventStore | Transaction

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
TRIAL_FACTS = (
    "SlotsAllocated",
    "TrialStarted",
    "TrialExited",
    "PreemptionRequested",
    "KillRequested",
    "CheckpointSaved",
    "TrialStateChanged",
    "TrialEarlyExited",
)
AGENT_FACTS = ("AgentRegistered", "AgentLost", "SlotsDisabled", "SlotsEnabled")
TRIAL_CONTROL_FACTS = ("TrialStateChanged", "TrialKillRequested")


@contextlib.asynccontextmanager
async def _connection(reader: Reader) -> AsyncIterator[Connection]:
    if isinstance(reader, Transaction):
        yield reader.conn
        return
    with translate_errors():
        async with reader.pool.acquire() as conn:
            yield conn


async def read_facts(
    reader: Reader,
    stream_id: str,
    types: Sequence[str],
    *,
    after_version: int = 0,
    trial_id: int | None = None,
) -> tuple[list[RecordedEvent], int]:
    """Reads one stream's events of ``types`` after ``after_version``, and its head version.

    Args:
        reader: the store or a transaction.
        stream_id: the stream.
        types: event types wanted.
        after_version: read only events above this version.
        trial_id: when set, ``TrialRequested`` events of other trials are skipped.

    Returns:
        The events in version order and the stream's current version (0: no such stream).
    """
    async with _connection(reader) as conn:
        with translate_errors():
            rows = await conn.fetch(
                """SELECT h.head, e.position, e.stream_id, e.stream_version, e.event_id, e.type,
                          e.schema_version, e.payload, e.metadata, e.recorded_at
                   FROM (SELECT coalesce(max(stream_version), 0) AS head
                         FROM events WHERE stream_id = $1) AS h
                   LEFT JOIN events e
                     ON e.stream_id = $1 AND e.stream_version > $2 AND e.type = ANY($3::text[])
                    AND ($4::text IS NULL OR e.type <> 'TrialRequested'
                         OR e.payload->>'trial_id' = $4)
                   ORDER BY e.stream_version""",
                stream_id,
                after_version,
                list(types),
                None if trial_id is None else trial_label(trial_id),
            )
    head = int(rows[0]["head"]) if rows else 0
    events = [row_to_event(r) for r in rows if r["position"] is not None]
    return events, head


def check_owner(principal: Principal, owner: str) -> None:
    """Raises 403 unless ``principal`` is an admin or the user ``owner`` (visibility and control
    of an experiment and of its trials and checkpoints)."""
    if not (principal.is_admin or (principal.kind == "user" and principal.name == owner)):
        raise forbidden("only the experiment's owner or an admin may do this")


# --- ids ------------------------------------------------------------------------------------


def trial_id_of(text: str) -> int:
    """The trial id a path names (``17``; a legacy trial also as ``9.1``); else a 404."""
    try:
        return parse_trial_id(text)
    except TrialIdError as exc:
        raise not_found(f"no trial {text[:40]!r}: {exc}") from None


def trial_of(allocation: str) -> int:
    """The trial of an allocation id (``17.2`` -> 17); an invalid id is a 404."""
    try:
        return parse_allocation_id(allocation)[0]
    except TrialIdError as exc:
        raise not_found(f"no allocation {allocation[:40]!r}: {exc}") from None


async def experiment_of(reader: Reader, trial_id: int) -> int:
    """The experiment that requested ``trial_id``; a trial never requested is a 404."""
    async with _connection(reader) as conn:
        with translate_errors():
            value = await conn.fetchval(
                # Raw payloads: the text of the stored id is the trial's label (events.names).
                """SELECT (payload->>'experiment_id')::bigint FROM events
                   WHERE type = 'TrialRequested' AND payload->>'trial_id' = $1
                   ORDER BY position LIMIT 1""",
                trial_label(trial_id),
            )
    if value is None:
        raise not_found(f"no trial {trial_id}")
    return int(value)


def agent_stream(agent_id: str) -> str:
    """The stream id of an agent."""
    return f"agent-{agent_id}"


# --- experiment -----------------------------------------------------------------------------


@dataclass
class ExperimentView:
    """An experiment as far as the gateway cares: config, owner, state, requested trials."""

    experiment_id: int
    version: int = 0
    submitted: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    code_ref: str | None = None
    warnings: list[dict[str, str]] = field(default_factory=list)
    owner: str = ""
    state: str = "ACTIVE"
    archived: bool = False
    submitted_at: datetime | None = None
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
        """The live-fold part of ``GET /api/v1/experiments/{id}`` (the route adds projections)."""
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
            "num_trials": len(self.trials),
            "searcher_metric": self.searcher.get("metric"),
            "smaller_is_better": self.smaller_is_better,
            "submitted_at": iso(self.submitted_at),
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


def iso(value: datetime | None) -> str | None:
    """An ISO 8601 timestamp, or ``None``."""
    return value.isoformat() if value is not None else None


SettingsChange = (
    ExperimentRenamed | ExperimentDescribed | ExperimentLabelsChanged | ExperimentResourcesChanged
)
"""A user's change of an experiment's name, description, labels or resources."""


def fold_experiment(experiment_id: int, events: Iterable[RecordedEvent]) -> ExperimentView:
    """Folds an experiment stream."""
    view = ExperimentView(experiment_id)
    for recorded in events:
        view.version = max(view.version, recorded.stream_version)
        event = recorded.decode()
        if isinstance(event, ExperimentSubmitted):
            view.submitted = True
            view.config = event.config
            view.code_ref = event.code_ref
            view.warnings = [w.model_dump() for w in event.warnings]
            view.owner = event.owner
            view.state = "ACTIVE" if event.activate else "PAUSED"
            view.submitted_at = recorded.recorded_at
        elif isinstance(event, ExperimentStateChanged):
            view.state = event.state
            if event.state in lifecycle.TERMINAL:
                view.ended_at = recorded.recorded_at
        elif isinstance(event, ExperimentArchived):
            view.archived = event.archived
        elif isinstance(event, SettingsChange):
            view.config = apply_settings(view.config, event)
        elif isinstance(event, ExperimentContinued):
            if view.state in lifecycle.TERMINAL:
                view.state = lifecycle.ACTIVE
                view.ended_at = None
                view.config = dict(event.config)
                requested = view.trials.get(event.trial_id)
                if requested is not None:
                    view.trials[event.trial_id] = requested.model_copy(
                        update={"hparams": dict(event.hparams)}
                    )
        elif isinstance(event, TrialRequested):
            view.trials[event.trial_id] = event
            view.requested_at[event.trial_id] = recorded.recorded_at
    return view


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


async def load_experiment(
    reader: Reader, experiment_id: int, *, trial_id: int | None = None, with_trials: bool = True
) -> ExperimentView:
    """Loads an experiment; a missing one is a 404.

    Args:
        reader: the store or a transaction.
        experiment_id: the experiment.
        trial_id: keep only this trial's ``TrialRequested``.
        with_trials: ``False`` skips every ``TrialRequested`` (state and config only).
    """
    types = EXPERIMENT_FACTS if with_trials else EXPERIMENT_FACTS[:-1]
    events, head = await read_facts(
        reader, experiment_stream(experiment_id), types, trial_id=trial_id
    )
    view = fold_experiment(experiment_id, events)
    view.version = head
    if not view.exists:
        raise not_found(f"no experiment {experiment_id}")
    return view


# --- trial ----------------------------------------------------------------------------------


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


@dataclass
class TrialView:
    """A trial's stream folded: its allocations, latest checkpoint and state."""

    trial_id: int
    version: int = 0
    allocations: dict[str, AllocationView] = field(default_factory=dict)
    latest_allocation: str | None = None
    latest_checkpoint: CheckpointSaved | None = None
    state: str = "ACTIVE"
    early_exited: bool = False

    def is_current(self, allocation_id: str) -> bool:
        """Whether ``allocation_id`` is the trial's latest allocation and has not exited."""
        alloc = self.allocations.get(allocation_id)
        return alloc is not None and allocation_id == self.latest_allocation and not alloc.exited

    def allocation(self, allocation_id: str) -> AllocationView:
        """The allocation, or a 404 when the scheduler never made it."""
        alloc = self.allocations.get(allocation_id)
        if alloc is None:
            raise not_found(f"no allocation {allocation_id}")
        return alloc

    @property
    def current_run_id(self) -> int | None:
        """The run id of the latest allocation, if any."""
        if self.latest_allocation is None:
            return None
        return self.allocations[self.latest_allocation].run_id


def fold_trial(trial_id: int, events: Iterable[RecordedEvent]) -> TrialView:
    """Folds a trial stream."""
    view = TrialView(trial_id)
    for recorded in events:
        apply_trial(view, recorded)
    return view


def apply_trial(view: TrialView, recorded: RecordedEvent) -> None:
    """Applies one trial event to ``view`` in place (for incremental polling)."""
    view.version = max(view.version, recorded.stream_version)
    event = recorded.decode()
    if isinstance(event, SlotsAllocated):
        view.allocations[event.allocation_id] = AllocationView(
            event.allocation_id, event.run_id, dict(event.placements)
        )
        view.latest_allocation = event.allocation_id
        return
    alloc_id = getattr(event, "allocation_id", None)
    alloc = view.allocations.get(alloc_id) if isinstance(alloc_id, str) else None
    if isinstance(event, TrialStarted) and alloc is not None:
        alloc.started = True
    elif isinstance(event, TrialExited) and alloc is not None:
        alloc.exited = True
    elif isinstance(event, PreemptionRequested) and alloc is not None:
        alloc.preempt = True
    elif isinstance(event, KillRequested) and alloc is not None:
        alloc.kill = True
    elif isinstance(event, CheckpointSaved):
        view.latest_checkpoint = event
    elif isinstance(event, TrialStateChanged):
        view.state = event.state
    elif isinstance(event, TrialEarlyExited):
        view.early_exited = True


async def load_trial(reader: Reader, trial_id: int) -> TrialView:
    """Loads a trial; one with no events yet is a 404."""
    events, head = await read_facts(reader, trial_stream(trial_id), TRIAL_FACTS)
    view = fold_trial(trial_id, events)
    view.version = head
    if view.version == 0:
        raise not_found(f"no trial {trial_id}")
    return view


async def refresh_trial(reader: Reader, view: TrialView) -> None:
    """Applies what was appended to the trial since ``view`` was loaded."""
    events, head = await read_facts(
        reader, trial_stream(view.trial_id), TRIAL_FACTS, after_version=view.version
    )
    for recorded in events:
        apply_trial(view, recorded)
    view.version = max(view.version, head)


@dataclass
class TrialControlView:
    """A trial's lifecycle state and whether a user's kill is pending, for ``kill`` and logs."""

    trial_id: int
    version: int = 0
    state: str = lifecycle.ACTIVE
    kill_pending: bool = False

    @property
    def terminal(self) -> bool:
        """Whether the trial has ended (COMPLETED, CANCELED or ERROR)."""
        return self.state in lifecycle.TERMINAL


async def load_trial_control(reader: Reader, trial_id: int) -> TrialControlView:
    """Folds a trial's state changes and kill requests (a trial with no stream yet is ACTIVE)."""
    events, head = await read_facts(reader, trial_stream(trial_id), TRIAL_CONTROL_FACTS)
    view = TrialControlView(trial_id, version=head)
    view.state = lifecycle.fold_trial(events).state
    for recorded in events:
        event = recorded.decode()
        if isinstance(event, TrialKillRequested):
            view.kill_pending = True
        elif isinstance(event, TrialStateChanged) and event.state in lifecycle.TERMINAL:
            view.kill_pending = False
    return view


Outcome = Literal["completed", "failed", "killed", "preempted", "lost"]


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


# --- agent ----------------------------------------------------------------------------------


@dataclass
class AgentView:
    """An agent's stream folded: its latest registration, whether it was lost since, and which
    of its slots users disabled."""

    agent_id: str
    version: int = 0
    registration: AgentRegistered | None = None
    lost: bool = False
    disabled: set[str] = field(default_factory=set)

    @property
    def registered(self) -> bool:
        """Whether the agent is registered and not lost since."""
        return self.registration is not None and not self.lost

    @property
    def slot_ids(self) -> list[str]:
        """The slot ids of the latest registration."""
        return [s.slot_id for s in self.registration.slots] if self.registration else []


def fold_agent(agent_id: str, events: Iterable[RecordedEvent]) -> AgentView:
    """Folds an agent stream."""
    view = AgentView(agent_id)
    for recorded in events:
        view.version = max(view.version, recorded.stream_version)
        event = recorded.decode()
        if isinstance(event, AgentRegistered):
            view.registration = event
            view.lost = False
        elif isinstance(event, AgentLost):
            view.lost = True
        elif isinstance(event, SlotsDisabled):
            view.disabled |= set(event.slot_ids or view.slot_ids)
        elif isinstance(event, SlotsEnabled):
            view.disabled -= set(event.slot_ids or view.slot_ids)
    return view


async def load_agent(reader: Reader, agent_id: str) -> AgentView:
    """Loads an agent (an unknown agent folds to an unregistered view)."""
    events, head = await read_facts(reader, agent_stream(agent_id), AGENT_FACTS)
    view = fold_agent(agent_id, events)
    view.version = head
    return view


# --- allocation spec ------------------------------------------------------------------------


def environment_variables(config: dict[str, Any], device: str) -> dict[str, str]:
    """``environment.environment_variables`` as a dict, picking ``device``'s list from a map."""
    env = (config.get("environment") or {}).get("environment_variables") or []
    if isinstance(env, dict):
        env = env.get(device) or []
    out: dict[str, str] = {}
    for item in env:
        key, _, value = str(item).partition("=")
        out[key] = value
    return out


def build_spec(
    experiment: ExperimentView,
    trial: TrialView,
    allocation_id: str,
    *,
    agent_id: str | None,
    device: str,
    token: str,
) -> dict[str, Any]:
    """What an agent needs to launch one run (``GET /allocations/{id}/spec``)."""
    alloc = trial.allocation(allocation_id)
    requested = experiment.trials.get(trial.trial_id)
    if requested is None:
        raise not_found(f"trial {trial.trial_id} was never requested")
    if agent_id is not None and agent_id in alloc.placements:
        slot_ids = list(alloc.placements[agent_id])
    else:
        slot_ids = [s for slots in alloc.placements.values() for s in slots]
    checkpoint = trial.latest_checkpoint
    # A cloned trial's first run starts from its parent's checkpoint, recorded when it was
    # requested; once it saves its own, that one is the latest.
    latest = checkpoint.uuid if checkpoint else requested.warm_start_checkpoint
    steps = checkpoint.steps_completed if checkpoint else requested.warm_start_steps
    if latest is None:
        steps = 0
    config = experiment.config
    return {
        "active": trial.is_current(allocation_id),
        "allocation_id": allocation_id,
        "trial_id": trial.trial_id,
        "experiment_id": experiment.experiment_id,
        "run_id": alloc.run_id,
        "entrypoint": config.get("entrypoint"),
        "code_ref": experiment.code_ref,
        "hparams": requested.hparams,
        "trial_seed": requested.trial_seed,
        "latest_checkpoint": latest,
        "steps_completed": steps,
        "token": token,
        "checkpoint_storage": config.get("checkpoint_storage"),
        "environment_variables": environment_variables(config, device),
        "slot_ids": slot_ids,
        "placements": alloc.placements,
        "config": config,
    }
