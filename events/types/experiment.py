"""Facts on an experiment's stream (``experiment-<id>``)."""

from __future__ import annotations

from typing import Any

from events.envelope import Event
from events.registry import register


@register
class ExperimentSubmitted(Event):
    """A validated experiment config (and its code, by content address) was accepted."""

    event_type = "ExperimentSubmitted"

    experiment_id: int
    config: dict[str, Any]
    code_ref: str | None = None
    owner: str = "admin"
    activate: bool = True


@register
class TrialRequested(Event):
    """The searcher decided to run a trial with these hyperparameters and this seed."""

    event_type = "TrialRequested"

    experiment_id: int
    trial_id: str
    request_id: str
    hparams: dict[str, Any]
    trial_seed: int


@register
class TrialStopRequested(Event):
    """The searcher (or a user) asked a trial to stop at its next checkpoint boundary."""

    event_type = "TrialStopRequested"

    experiment_id: int
    trial_id: str
    request_id: str
    reason: str = "searcher"


@register
class ExperimentStateChanged(Event):
    """An experiment moved to a new state; user actions (pause, activate, cancel, kill) land here."""

    event_type = "ExperimentStateChanged"

    experiment_id: int
    state: str
    reason: str = ""
    actor: str = ""
