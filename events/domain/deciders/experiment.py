"""The experiment's deciders: submit, pause/activate/cancel/kill, archive/unarchive, delete,
change its settings (name, description, labels, resources) and continue it once it has ended.

Each ``decide_*`` is pure over the experiment's folded stream
(:class:`~events.domain.aggregates.ExperimentView`) and a command: it returns the events to
append to the experiment's stream (``[]``: nothing to change, the action is a repeat) or a
:class:`~events.domain.deciders.Refusal`. Who may act (owner or admin) is the caller's check,
made before it decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from events.domain import lifecycle
from events.domain.aggregates import ExperimentView, SettingsChange, TrialView
from events.domain.config import ConfigError, ConfigWarning, parse_config
from events.domain.config.merge import changed_paths, merge_under
from events.domain.deciders import Decision, Refusal, conflict, invalid
from events.domain.types import (
    ContinuedTrial,
    ExperimentArchived,
    ExperimentContinued,
    ExperimentDescribed,
    ExperimentLabelsChanged,
    ExperimentMoved,
    ExperimentRenamed,
    ExperimentResourcesChanged,
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialStateChanged,
)
from events.domain.types.experiment_changes import ResourceField
from events.log.envelope import Event

MAX_LABELS = 100
"""Most labels one experiment carries."""

CONTINUABLE = ("hyperparameters", "searcher.max_length", "max_restarts")
"""The config paths continuing a single-trial experiment may change: how long and how its trial
trains on, never what is searched, where checkpoints live or how the experiment competes for
slots."""
CONTINUABLE_SEARCH = ("max_restarts",)
"""The config paths continuing a search may change: its trials keep the hyperparameters and
length the searcher gave them."""
REOPENING_SEARCHERS = frozenset({"single", "random", "grid", "tpe"})
"""Searchers that can take a closed trial back (ASHA's decisions to stop trials are final)."""
UNCHANGEABLE = lifecycle.DELETION
"""States in which an experiment's settings no longer change."""

Action = Literal["pause", "activate", "cancel", "kill"]

TRANSITIONS: dict[Action, tuple[str, frozenset[str]]] = {
    "pause": (lifecycle.PAUSED, frozenset({lifecycle.ACTIVE})),
    "activate": (lifecycle.ACTIVE, frozenset({lifecycle.PAUSED, lifecycle.STOPPING_ERROR})),
    "cancel": (lifecycle.STOPPING_CANCELED, frozenset({lifecycle.ACTIVE, lifecycle.PAUSED})),
    "kill": (
        lifecycle.STOPPING_KILLED,
        frozenset({lifecycle.ACTIVE, lifecycle.PAUSED, lifecycle.STOPPING_CANCELED}),
    ),
}
"""Each user action: its target state and the states it may be taken from
(reference/determined.md §5.1)."""


# --- submit -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitExperiment:
    """Submit a validated config (and code, by content address) as experiment ``experiment_id``
    (the id is allocated by the caller, so the decision is the same on replay); an
    ``unmanaged`` one is reported to by a script outside the cluster, named ``external_id``."""

    experiment_id: int
    config: dict[str, Any]
    code_ref: str | None
    owner: str
    activate: bool = True
    warnings: tuple[ConfigWarning, ...] = ()
    unmanaged: bool = False
    external_id: str | None = None
    project_id: int = 1


def decide_submit(command: SubmitExperiment) -> list[Event]:
    """The submission of a new experiment (appended to a stream that must not exist yet)."""
    return [
        ExperimentSubmitted(
            experiment_id=command.experiment_id,
            config=command.config,
            code_ref=command.code_ref,
            owner=command.owner,
            activate=command.activate,
            warnings=list(command.warnings),
            unmanaged=command.unmanaged,
            external_id=command.external_id,
            project_id=command.project_id,
        )
    ]


# --- state --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangeState:
    """A user's pause, activate, cancel or kill, with the reason recorded on the change."""

    action: Action
    actor: str
    reason: str = ""


def decide_state(view: ExperimentView, command: ChangeState) -> Decision:
    """``ExperimentStateChanged`` to the action's target; ``[]`` when already there.

    Refused (conflict) for an unmanaged experiment (nothing on the cluster would act on it),
    and from a state the action may not be taken from.
    """
    action = command.action
    target, sources = TRANSITIONS[action]
    if view.unmanaged:
        return conflict(
            f"cannot {action} experiment {view.experiment_id}: it is unmanaged (its script "
            "starts and ends its runs; nothing on the cluster would act on this)"
        )
    if view.state == target:
        return []
    if view.state in lifecycle.ENDED or view.state not in sources:
        return conflict(f"cannot {action} an experiment in state {view.state}")
    try:
        lifecycle.check_experiment(view.state, target)
    except lifecycle.IllegalTransitionError as exc:
        return conflict(f"cannot {action}: {exc}")
    return [
        ExperimentStateChanged(
            experiment_id=view.experiment_id,
            state=target,
            reason=command.reason,
            actor=command.actor,
        )
    ]


# --- archive and delete -------------------------------------------------------------------


@dataclass(frozen=True)
class SetArchived:
    """Archive (``archived=True``) or unarchive an ended experiment."""

    archived: bool
    actor: str


def decide_archived(view: ExperimentView, command: SetArchived) -> Decision:
    """``ExperimentArchived``; ``[]`` when it already is (or is not) archived; refused
    (conflict) unless the experiment has ended (COMPLETED, CANCELED or ERROR)."""
    verb = "archive" if command.archived else "unarchive"
    if view.state not in lifecycle.TERMINAL:
        return conflict(f"cannot {verb} an experiment in state {view.state}")
    if view.archived == command.archived:
        return []
    return [
        ExperimentArchived(
            experiment_id=view.experiment_id, archived=command.archived, actor=command.actor
        )
    ]


@dataclass(frozen=True)
class MoveExperiment:
    """Move the experiment to project ``project_id`` (the caller checked that it exists, is not
    archived, and that the actor may take it out of its project and put it in that one)."""

    project_id: int
    actor: str
    archived_projects: frozenset[int] = frozenset()
    """The projects archived (or in an archived workspace) when the move was asked."""


def decide_move(view: ExperimentView, command: MoveExperiment) -> Decision:
    """``ExperimentMoved``; ``[]`` when it is there already; refused (conflict) for an archived
    experiment, or one in an archived project."""
    if view.project_id == command.project_id:
        return []
    if view.archived:
        return conflict("an archived experiment cannot move: unarchive it first")
    if view.project_id in command.archived_projects:
        return conflict(f"project {view.project_id} is archived: nothing moves out of it")
    return [
        ExperimentMoved(
            experiment_id=view.experiment_id,
            project_id=command.project_id,
            from_project_id=view.project_id,
            actor=command.actor,
        )
    ]


@dataclass(frozen=True)
class DeleteExperiment:
    """Delete an ended (or DELETE_FAILED) experiment: it moves to DELETING and the tracker
    removes its checkpoints.

    ``registered`` names each of its checkpoints that a model version keeps (e.g. ``model
    'mnist' version 2 (checkpoint <uuid>)``), as the caller read them under the registry lock.
    """

    actor: str
    registered: tuple[str, ...] = ()


def decide_delete(view: ExperimentView, command: DeleteExperiment) -> Decision:
    """``ExperimentStateChanged`` to DELETING; ``[]`` when already DELETING; refused
    (conflict) from a state the state machine does not allow it from, and while a checkpoint
    of it is registered as a model version."""
    if view.state == lifecycle.DELETING:
        return []
    try:
        lifecycle.check_experiment(view.state, lifecycle.DELETING)
    except lifecycle.IllegalTransitionError:
        return conflict(f"cannot delete an experiment in state {view.state}")
    if command.registered:
        return conflict(
            f"experiment {view.experiment_id} cannot be deleted: its checkpoints are registered "
            f"as model versions: {', '.join(command.registered)}; delete those versions first",
            code="checkpoints_registered",
        )
    return [
        ExperimentStateChanged(
            experiment_id=view.experiment_id,
            state=lifecycle.DELETING,
            reason="deleted by user",
            actor=command.actor,
        )
    ]


# --- settings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChangeSettings:
    """Change an experiment's name, description, labels or resources; ``None`` (or an empty
    tuple) leaves a field as it is.

    Attributes:
        labels: the whole new set of labels, or ``None``.
        add_labels: labels to add (after ``labels``).
        remove_labels: labels to remove (after adding).
        resources: only the resource fields the user gave, with their values (``None`` lifts
            ``max_slots``; it is invalid for ``priority`` and ``weight``); ``None``: no change.
    """

    actor: str
    name: str | None = None
    description: str | None = None
    labels: tuple[str, ...] | None = None
    add_labels: tuple[str, ...] = ()
    remove_labels: tuple[str, ...] = ()
    resources: Mapping[ResourceField, int | float | None] | None = None


def decide_settings(
    view: ExperimentView, command: ChangeSettings
) -> list[SettingsChange] | Refusal:
    """One fact per setting that changes (renamed, described, labels, resources), in that
    order; a field set to the value it has records nothing.

    Refused: conflict while the experiment is being deleted; invalid for more than
    :data:`MAX_LABELS` labels, a null priority or weight, or ``max_slots`` below
    ``slots_per_trial``.
    """
    exp_id = view.experiment_id
    if view.state in UNCHANGEABLE:
        return conflict(f"experiment {exp_id} is {view.state}; it cannot be changed")
    actor = command.actor
    events: list[SettingsChange] = []
    if command.name is not None and command.name != view.settings.name:
        events.append(ExperimentRenamed(experiment_id=exp_id, name=command.name, actor=actor))
    if command.description is not None and command.description != view.settings.description:
        events.append(
            ExperimentDescribed(experiment_id=exp_id, description=command.description, actor=actor)
        )
    current = list(view.settings.labels)
    if command.labels is not None or command.add_labels or command.remove_labels:
        labels = _labels_after(current, command)
        if len(labels) > MAX_LABELS:
            return invalid(f"labels: at most {MAX_LABELS} labels", "labels")
        if labels != current:
            events.append(
                ExperimentLabelsChanged(
                    experiment_id=exp_id,
                    labels=labels,
                    added=[x for x in labels if x not in current],
                    removed=[x for x in current if x not in labels],
                    actor=actor,
                )
            )
    if command.resources is not None:
        resources = _resources_change(view, command.resources, actor)
        if isinstance(resources, Refusal):
            return resources
        events.extend(resources)
    return events


def _labels_after(current: list[str], command: ChangeSettings) -> list[str]:
    labels = list(command.labels) if command.labels is not None else list(current)
    for label in command.add_labels:
        if label not in labels:
            labels.append(label)
    removed = set(command.remove_labels)
    return list(dict.fromkeys(label for label in labels if label not in removed))


def _resources_change(
    view: ExperimentView, given: Mapping[ResourceField, int | float | None], actor: str
) -> list[SettingsChange] | Refusal:
    if "priority" in given and given["priority"] is None:
        return invalid("resources.priority: must be 1 to 99", "resources.priority")
    if "weight" in given and given["weight"] is None:
        return invalid("resources.weight: must be a positive number", "resources.weight")
    current = view.resources
    slots_per_trial = int(current.get("slots_per_trial") or 1)
    max_slots = given.get("max_slots")
    if max_slots is not None and max_slots < slots_per_trial:
        return invalid(
            f"resources.max_slots: must be >= slots_per_trial ({slots_per_trial}), got {max_slots}",
            "resources.max_slots",
        )
    keys: tuple[ResourceField, ...] = ("priority", "weight", "max_slots")
    changes = {key: given[key] for key in keys if key in given and given[key] != current.get(key)}
    if not changes:
        return []
    return [
        ExperimentResourcesChanged(experiment_id=view.experiment_id, resources=changes, actor=actor)
    ]


# --- continue -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ContinueExperiment:
    """Continue an ended experiment, with ``config`` (a partial config) merged over its own."""

    actor: str
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ContinueState:
    """What continuing an experiment decides over.

    Attributes:
        experiment: the experiment's folded stream, with its requested trials.
        trial_states: every requested trial's lifecycle state.
        trials: the folded stream of every trial that has ended (at least).
        deleted_checkpoints: uuids of the experiment's checkpoints deleted or being deleted.
    """

    experiment: ExperimentView
    trial_states: Mapping[int, str]
    trials: Mapping[int, TrialView]
    deleted_checkpoints: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Continuation:
    """The events continuing an experiment appends, per stream.

    Attributes:
        experiment: ``ExperimentContinued``, for the experiment's stream.
        trials: per continued trial (in id order), its ``TrialStateChanged`` back to ACTIVE.
        latest_checkpoints: per continued trial, the checkpoint it trains on from.
    """

    experiment: list[Event]
    trials: dict[int, list[Event]]
    latest_checkpoints: dict[int, str | None]


def decide_continue(state: ContinueState, command: ContinueExperiment) -> Continuation | Refusal:
    """A single-trial experiment's trial, or each trial of a search that did not complete,
    trains on from its latest checkpoint.

    Refused (conflict) unless the experiment ended, when it is archived, when its searcher
    cannot reopen trials (ASHA), a trial has not ended, every trial completed, or a trial's
    latest checkpoint was deleted; refused (invalid, naming the ``config.`` path) for a config
    that is invalid or changes what continuing may not.
    """
    view = state.experiment
    experiment_id = view.experiment_id
    if view.state not in lifecycle.TERMINAL:
        return conflict(
            f"experiment {experiment_id} is {view.state}; only an ended experiment "
            "(COMPLETED, CANCELED, ERROR) can be continued"
        )
    if view.archived:
        return conflict(f"experiment {experiment_id} is archived; unarchive it first")
    searcher = str(view.searcher.get("name"))
    if searcher not in REOPENING_SEARCHERS:
        return conflict(
            f"experiment {experiment_id} ran a {searcher!r} search, whose decisions to stop "
            f"trials are final; only {', '.join(sorted(REOPENING_SEARCHERS))} experiments "
            "can be continued (submit a new experiment instead)"
        )
    single = searcher == "single" and len(view.trials) == 1
    for trial_id in sorted(view.trials):
        trial_state = state.trial_states.get(trial_id, lifecycle.ACTIVE)
        if trial_state not in lifecycle.TERMINAL:
            return conflict(f"trial {trial_id} is {trial_state}; it has not ended")
    chosen = [
        t for t in sorted(view.trials) if single or state.trial_states[t] != lifecycle.COMPLETED
    ]
    if not chosen:
        return conflict(
            f"every trial of experiment {experiment_id} completed; there is nothing to continue"
        )
    latest: dict[int, str | None] = {}
    for trial_id in chosen:
        checkpoint = state.trials[trial_id].latest_checkpoint
        uuid = checkpoint.uuid if checkpoint else None
        if uuid is not None and uuid in state.deleted_checkpoints:
            return conflict(
                f"trial {trial_id}'s latest checkpoint {uuid} was deleted; "
                "it cannot be continued from it"
            )
        latest[trial_id] = uuid
    config = _continued_config(view, command.config, CONTINUABLE if single else CONTINUABLE_SEARCH)
    if isinstance(config, Refusal):
        return config
    continued_trials: list[ContinuedTrial] = []
    for trial_id in chosen:
        hparams = _continued_hparams(view.config, config, view.trials[trial_id].hparams)
        if isinstance(hparams, Refusal):
            return hparams
        continued_trials.append(ContinuedTrial(trial_id=trial_id, hparams=hparams))
    continued = ExperimentContinued(
        experiment_id=experiment_id, trials=continued_trials, config=config, actor=command.actor
    )
    reopened: dict[int, list[Event]] = {
        trial_id: [
            TrialStateChanged(trial_id=trial_id, state=lifecycle.ACTIVE, reason="continued by user")
        ]
        for trial_id in chosen
    }
    return Continuation(experiment=[continued], trials=reopened, latest_checkpoints=latest)


def _continued_config(
    view: ExperimentView, partial: Mapping[str, Any], continuable: tuple[str, ...]
) -> dict[str, Any] | Refusal:
    """The config merged with ``partial`` and validated, or a refusal naming a path it may not
    change."""
    merged = merge_under(view.config, dict(partial))
    try:
        config = parse_config(merged).model_dump(mode="json")
    except ConfigError as exc:
        errors = exc.errors or [("<config>", "invalid config")]
        path, message = errors[0]
        return invalid(f"invalid config: {path}: {message}", f"config.{path}")
    for path in changed_paths(view.config, config):
        if not any(path == p or path.startswith(f"{p}.") for p in continuable):
            what = "a single-trial experiment" if continuable == CONTINUABLE else "a search"
            return invalid(
                f"config.{path}: cannot be changed when continuing {what} (only "
                f"{', '.join(continuable)} can)",
                f"config.{path}",
            )
    return config


def _continued_hparams(
    before: dict[str, Any], after: dict[str, Any], hparams: dict[str, Any]
) -> dict[str, Any] | Refusal:
    """The trial's hparams with the constants the new config changed."""
    out = dict(hparams)
    old_hps, new_hps = before.get("hyperparameters") or {}, after.get("hyperparameters") or {}
    for name in sorted(set(old_hps) | set(new_hps)):
        if old_hps.get(name) == new_hps.get(name):
            continue
        value = new_hps.get(name)
        if not (isinstance(value, dict) and value.get("type") == "const"):
            return invalid(
                f"config.hyperparameters.{name}: only a constant value can be set when "
                "continuing a trial",
                f"config.hyperparameters.{name}",
            )
        out[name] = value.get("val")
    return out
