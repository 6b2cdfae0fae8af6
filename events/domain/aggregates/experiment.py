"""The experiment fold: config, owner, state, settings and requested trials of one stream."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events.domain import lifecycle
from events.domain.aggregates.common import iso
from events.domain.config.experiment_settings import ExperimentSettings
from events.domain.config.secrets import mask_secrets
from events.domain.types import (
    ExperimentArchived,
    ExperimentContinued,
    ExperimentDescribed,
    ExperimentLabelsChanged,
    ExperimentMoved,
    ExperimentRenamed,
    ExperimentResourcesChanged,
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialRequested,
)
from events.log.envelope import Event, RecordedEvent

EXPERIMENT_FACTS = (
    "ExperimentSubmitted",
    "ExperimentStateChanged",
    "ExperimentArchived",
    "ExperimentRenamed",
    "ExperimentDescribed",
    "ExperimentLabelsChanged",
    "ExperimentResourcesChanged",
    "ExperimentContinued",
    "ExperimentMoved",
    "TrialRequested",
)
"""What :func:`apply_experiment` reads (``TrialRequested`` last: leave it out for state only)."""

ExperimentFact = (
    ExperimentSubmitted
    | ExperimentStateChanged
    | ExperimentArchived
    | ExperimentRenamed
    | ExperimentDescribed
    | ExperimentLabelsChanged
    | ExperimentResourcesChanged
    | ExperimentContinued
    | ExperimentMoved
    | TrialRequested
)
"""An event of :data:`EXPERIMENT_FACTS`."""

SettingsChange = (
    ExperimentRenamed | ExperimentDescribed | ExperimentLabelsChanged | ExperimentResourcesChanged
)
"""A user's change of an experiment's name, description, labels or resources."""


@dataclass(slots=True)
class ExperimentView:
    """An experiment's stream folded: config and its typed settings, owner, state, trials."""

    experiment_id: int
    version: int = 0
    submitted: bool = False
    config: dict[str, Any] = field(default_factory=dict)
    settings: ExperimentSettings = field(default_factory=ExperimentSettings)
    code_ref: str | None = None
    warnings: list[dict[str, str]] = field(default_factory=list)
    owner: str = ""
    project_id: int = 1
    """The project it is in (:mod:`events.domain.aggregates.teams` knows its workspace)."""
    state: str = lifecycle.ACTIVE
    archived: bool = False
    unmanaged: bool = False
    external_id: str | None = None
    submitted_at: datetime | None = None
    submitted_position: int | None = None
    ended_at: datetime | None = None
    trials: dict[int, TrialRequested] = field(default_factory=dict)
    """The requested trials by id, in the order they were requested."""
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
        """The config's ``resources`` section as submitted (empty when absent)."""
        resources = self.config.get("resources")
        return resources if isinstance(resources, dict) else {}

    @property
    def smaller_is_better(self) -> bool:
        """Whether a smaller searcher metric is better (the searcher's default: yes)."""
        return self.settings.smaller_is_better

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
        return {
            "id": self.experiment_id,
            "state": self.state,
            "owner": self.owner,
            "project_id": self.project_id,
            "code_ref": self.code_ref,
            "config": mask_secrets(self.config),
            "warnings": self.warnings,
            "name": self.settings.name,
            "description": self.settings.description,
            "labels": list(self.settings.labels),
            "priority": self.resources.get("priority"),
            "weight": self.resources.get("weight"),
            "max_slots": self.resources.get("max_slots"),
            "archived": self.archived,
            "unmanaged": self.unmanaged,
            "external_id": self.external_id,
            "num_trials": len(self.trials),
            "searcher_metric": self.settings.metric,
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


def fold_experiment(experiment_id: int, events: Iterable[RecordedEvent]) -> ExperimentView:
    """Folds an experiment's stream."""
    view = ExperimentView(experiment_id)
    for recorded in events:
        apply_experiment(view, recorded)
    return view


def apply_experiment(
    view: ExperimentView, recorded: RecordedEvent, event: Event | None = None
) -> bool:
    """Applies one experiment event to ``view`` in place.

    Args:
        view: the experiment folded so far.
        recorded: the event as the log holds it.
        event: ``recorded`` already decoded (decoded here when ``None``).

    Returns:
        Whether the event changed the view; ``False`` for another type, or for a state change or
        a continuation the state machine refuses (nothing of it is applied).
    """
    view.version = max(view.version, recorded.stream_version)
    if recorded.type not in EXPERIMENT_FACTS:
        return False
    if event is None:
        event = recorded.decode()
    if isinstance(event, ExperimentSubmitted):
        view.submitted = True
        view.config = event.config
        view.settings = event.settings
        view.code_ref = event.code_ref
        view.warnings = [w.model_dump() for w in event.warnings]
        view.owner = event.owner
        view.project_id = event.project_id
        view.unmanaged = event.unmanaged
        view.external_id = event.external_id
        view.state = lifecycle.initial_experiment_state(event.activate)
        view.submitted_at = recorded.recorded_at
        view.submitted_position = recorded.position
    elif isinstance(event, ExperimentStateChanged):
        after = lifecycle.next_experiment_state(view.state, event.state)
        if after is None:
            return False
        view.state = after
        if after in lifecycle.TERMINAL:
            view.ended_at = recorded.recorded_at
    elif isinstance(event, ExperimentArchived):
        view.archived = event.archived
    elif isinstance(event, ExperimentMoved):
        view.project_id = event.project_id
    elif isinstance(event, SettingsChange):
        view.config = apply_settings(view.config, event)
        view.settings = ExperimentSettings.of(view.config)
    elif isinstance(event, ExperimentContinued):
        if not lifecycle.can_continue(view.state):
            return False
        view.state = lifecycle.ACTIVE
        view.ended_at = None
        view.config = dict(event.config)
        view.settings = event.settings
        for continued in event.trials:
            requested = view.trials.get(continued.trial_id)
            if requested is not None:
                view.trials[continued.trial_id] = requested.model_copy(
                    update={"hparams": dict(continued.hparams)}
                )
    elif isinstance(event, TrialRequested):
        view.trials[event.trial_id] = event
        view.requested_at[event.trial_id] = recorded.recorded_at
    return True


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
