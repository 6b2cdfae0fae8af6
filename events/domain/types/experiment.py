"""Facts on an experiment's stream (``experiment-<id>``)."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from events.domain.config.experiment_settings import ExperimentSettings
from events.domain.config.ignored import ConfigWarning
from events.domain.types.legacy import integer_trial_id, legacy_ordinal
from events.log.envelope import Event
from events.log.registry import register, upcaster

MAX_EXTERNAL_ID = 256
"""The longest external experiment or trial id an unmanaged run may give (characters)."""


@register
class ExperimentSubmitted(Event):
    """A validated experiment config (and its code, by content address) was accepted.

    ``warnings`` names what the config sets that cairn accepted but ignores, as the submitter
    was told (version 2; a version 1 payload had none recorded).

    An ``unmanaged`` experiment (version 3) is one a script started outside the cluster
    reports to (``core_v2``): no searcher, scheduler or agent acts on it, and its trials' runs
    are opened and closed by the script through the API. ``external_id`` is the name its owner
    gave it (``core_v2.Config.external_experiment_id``), unique per owner. Version 2 payloads
    are managed experiments without one.

    ``config`` is stored as the JSON it was validated as; readers act on :attr:`settings`, its
    typed fields with the config models' defaults.

    ``project_id`` is the project it was created in (version 4; before, every experiment was in
    the default project, 1). ``ExperimentMoved`` moves it later.
    """

    event_type = "ExperimentSubmitted"
    schema_version = 4

    experiment_id: int
    config: dict[str, Any]
    code_ref: str | None = None
    owner: str = "admin"
    activate: bool = True
    warnings: list[ConfigWarning] = Field(default_factory=list)
    unmanaged: bool = False
    external_id: str | None = Field(None, min_length=1, max_length=MAX_EXTERNAL_ID)
    project_id: int = 1

    @cached_property
    def settings(self) -> ExperimentSettings:
        """The config's typed settings (read once, defaults applied)."""
        return ExperimentSettings.of(self.config)


@upcaster("ExperimentSubmitted", 1)
def _experiment_submitted_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "warnings": []}


@upcaster("ExperimentSubmitted", 2)
def _experiment_submitted_v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "unmanaged": False, "external_id": None}


@upcaster("ExperimentSubmitted", 3)
def _experiment_submitted_v3_to_v4(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "project_id": 1}


@register
class TrialRequested(Event):
    """The searcher decided to run a trial with these hyperparameters and this seed.

    ``trial_id`` is the trial's cluster-wide integer id, taken from a sequence when the searcher
    decided (see :mod:`events.domain.names`); ``seq`` numbers the experiment's trials 1, 2, ... in the
    order they were requested.

    A trial cloned from another (population-based training) names its ``parent_trial_id``, the
    search ``round`` that cloned it, the ``change`` of hyperparameters from the parent's
    (``{name: {"from": old, "to": new}}``, dotted names for nested ones) and the parent's
    checkpoint it starts from (``warm_start_checkpoint``, trained ``warm_start_steps`` batches):
    its first run restores that checkpoint as if it were its own latest one.

    A trial of an unmanaged experiment is requested by the API, not the searcher, when a
    script first names it; ``external_id`` is the name the script gave it
    (``core_v2.Config.external_trial_id``), unique within its experiment (version 4).

    v1 stored ``trial_id`` as ``"<experiment>.<seq>"``; v2 had no lineage; v3 no external id.
    """

    event_type = "TrialRequested"
    schema_version = 4

    experiment_id: int
    trial_id: int
    seq: int = Field(ge=0)
    request_id: str
    hparams: dict[str, Any]
    trial_seed: int
    parent_trial_id: int | None = None
    round: int | None = Field(None, ge=0)
    change: dict[str, Any] = Field(default_factory=dict)
    warm_start_checkpoint: str | None = None
    warm_start_steps: int = Field(0, ge=0)
    external_id: str | None = Field(None, min_length=1, max_length=MAX_EXTERNAL_ID)


@register
class TrialStopRequested(Event):
    """The searcher (or a user) asked a trial to stop at its next checkpoint boundary.

    v1 stored ``trial_id`` as ``"<experiment>.<n>"``.
    """

    event_type = "TrialStopRequested"
    schema_version = 2

    experiment_id: int
    trial_id: int
    request_id: str
    reason: str = "searcher"


@upcaster("TrialRequested", 1)
def _trial_requested_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**integer_trial_id(payload), "seq": legacy_ordinal(payload.get("trial_id"))}


@upcaster("TrialRequested", 2)
def _trial_requested_v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        **payload,
        "parent_trial_id": None,
        "round": None,
        "change": {},
        "warm_start_checkpoint": None,
        "warm_start_steps": 0,
    }


@upcaster("TrialRequested", 3)
def _trial_requested_v3_to_v4(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "external_id": None}


upcaster("TrialStopRequested", 1)(integer_trial_id)


@register
class ExperimentStateChanged(Event):
    """An experiment moved to a new state; user actions (pause, activate, cancel, kill) land here."""

    event_type = "ExperimentStateChanged"

    experiment_id: int
    state: str
    reason: str = ""
    actor: str = ""


class CustomSearcherOp(BaseModel):
    """One operation a custom searcher answered: ``create`` a trial (its ``request_id`` and
    ``hparams``) or ``stop`` the trial of ``request_id``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: Literal["create", "stop"]
    request_id: str = Field(max_length=64)
    hparams: dict[str, Any] | None = None


@register
class CustomSearcherAnswered(Event):
    """The experiment's custom searcher answered call number ``call`` with ``ops`` (each a
    ``create`` with its ``request_id`` and ``hparams``, or a ``stop`` of a ``request_id``), at
    most once per call; the searcher service applies them when it folds this event.

    The searcher service numbers the calls it makes to a custom searcher 1, 2, ... in the order
    its fold of the log decides them (``initial_operations`` first, then ``on_validation`` and
    ``on_trial_exited`` as trials report and end), so the same log always asks the same calls.
    The method runs in a sandboxed process, outside the service's transactions; its answer is
    recorded here, once per call, and the service applies it (under the search's rules, such as
    ``max_trials``) when it folds this event. A restarted or failed-over searcher reads answers
    from the log and never asks an answered call again. ``hook`` is the method that answered
    and ``request_id`` the trial the call was about, for readers.
    """

    event_type = "CustomSearcherAnswered"

    experiment_id: int
    call: int = Field(ge=1)
    hook: str
    request_id: str | None = None
    ops: list[CustomSearcherOp] = Field(default_factory=list)


@register
class CustomSearcherFailed(Event):
    """Call number ``call`` of the experiment's custom searcher got no usable answer: it raised,
    took longer than its time limit, answered garbage or too much, or its process died.
    ``reason`` says which; the searcher service ends the experiment in error with it. Like
    :class:`CustomSearcherAnswered` it settles the call, at most once.
    """

    event_type = "CustomSearcherFailed"

    experiment_id: int
    call: int = Field(ge=1)
    hook: str
    reason: str = Field(max_length=1000)


@register
class ExperimentArchived(Event):
    """A user archived (hid from default listings) or unarchived a terminal experiment."""

    event_type = "ExperimentArchived"

    experiment_id: int
    archived: bool
    actor: str = ""


@register
class CheckpointsDeleted(Event):
    """The tracker deleted these checkpoints' files (garbage collection, experiment deletion, or
    a user's ``CheckpointsDeleteRequested``).

    ``missing`` lists those whose directory was already gone, which is not an error. Version 2
    added the reason ``user``; a version 1 payload is valid as it is.
    """

    event_type = "CheckpointsDeleted"
    schema_version = 2

    experiment_id: int
    uuids: list[str]
    missing: list[str] = Field(default_factory=list)
    reason: Literal["gc", "experiment deleted", "user"] = "gc"


@upcaster("CheckpointsDeleted", 1)
def _checkpoints_deleted_v1(payload: dict[str, Any]) -> dict[str, Any]:
    """Version 1 allowed a subset of version 2's reasons: nothing to change."""
    return dict(payload)
