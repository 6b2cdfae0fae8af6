"""The experiment's deciders (:mod:`events.domain.deciders.experiment`) over folded state: what
each user action appends and why it is refused; no HTTP, no database."""

from __future__ import annotations

from typing import Any

import pytest

from events.domain import lifecycle
from events.domain.aggregates import ExperimentView, TrialView
from events.domain.config import parse_config
from events.domain.config.experiment_settings import ExperimentSettings
from events.domain.deciders import Refusal
from events.domain.deciders.experiment import (
    MAX_LABELS,
    TRANSITIONS,
    Action,
    ChangeSettings,
    ChangeState,
    Continuation,
    ContinueExperiment,
    ContinueState,
    DeleteExperiment,
    SetArchived,
    SubmitExperiment,
    decide_archived,
    decide_continue,
    decide_delete,
    decide_settings,
    decide_state,
    decide_submit,
)
from events.domain.types import (
    CheckpointSaved,
    ExperimentArchived,
    ExperimentContinued,
    ExperimentLabelsChanged,
    ExperimentRenamed,
    ExperimentResourcesChanged,
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialRequested,
    TrialStateChanged,
)

EXP = 7


def experiment(state: str = lifecycle.ACTIVE, **fields: Any) -> ExperimentView:
    """A submitted experiment of alice's in ``state`` (its settings read from ``config``)."""
    if "config" in fields:
        fields.setdefault("settings", ExperimentSettings.of(fields["config"]))
    return ExperimentView(EXP, version=3, submitted=True, owner="alice", state=state, **fields)


def config(searcher: str = "single", **extra: Any) -> dict[str, Any]:
    """A validated config as the log holds it."""
    raw = {"searcher": {"name": searcher, "metric": "loss", "max_trials": 2}, **extra}
    if searcher == "single":
        raw["searcher"] = {"name": "single", "metric": "loss"}
    if searcher not in ("single", "random"):
        return raw  # refused before it is parsed
    return parse_config(raw, default_seed=1).model_dump(mode="json")


def requested(trial_id: int, seq: int, **hparams: Any) -> TrialRequested:
    """The request of trial ``trial_id``."""
    return TrialRequested(
        experiment_id=EXP,
        trial_id=trial_id,
        seq=seq,
        request_id=f"r{seq}",
        hparams=hparams,
        trial_seed=seq,
    )


def test_submit_records_the_config_code_owner_and_warnings_as_given() -> None:
    """Submitting decides exactly one ExperimentSubmitted carrying the command's fields."""
    events = decide_submit(
        SubmitExperiment(EXP, config={"a": 1}, code_ref=None, owner="alice", activate=False)
    )
    assert events == [
        ExperimentSubmitted(
            experiment_id=EXP, config={"a": 1}, code_ref=None, owner="alice", activate=False
        )
    ]


@pytest.mark.parametrize(
    ("action", "start"),
    [
        ("pause", lifecycle.ACTIVE),
        ("activate", lifecycle.PAUSED),
        ("activate", lifecycle.STOPPING_ERROR),
        ("cancel", lifecycle.PAUSED),
        ("kill", lifecycle.STOPPING_CANCELED),
    ],
)
def test_an_allowed_action_moves_to_its_target_with_the_reason(action: Action, start: str) -> None:
    """Each action from an allowed state records its target state, reason and actor."""
    events = decide_state(experiment(start), ChangeState(action, actor="bob", reason="why"))
    assert events == [
        ExperimentStateChanged(
            experiment_id=EXP, state=TRANSITIONS[action][0], reason="why", actor="bob"
        )
    ]


def test_an_action_already_done_decides_nothing() -> None:
    """Pausing a paused experiment appends nothing (``changed: false``), not a refusal."""
    assert decide_state(experiment(lifecycle.PAUSED), ChangeState("pause", actor="a")) == []


@pytest.mark.parametrize(
    ("action", "start"),
    [
        ("pause", lifecycle.COMPLETED),
        ("pause", lifecycle.STOPPING_CANCELED),
        ("activate", lifecycle.DELETING),
        ("cancel", lifecycle.STOPPING_KILLED),
    ],
)
def test_an_action_from_a_state_it_may_not_leave_is_a_conflict(action: Action, start: str) -> None:
    """From a state not among the action's sources, the action is refused naming the state."""
    decision = decide_state(experiment(start), ChangeState(action, actor="a"))
    assert decision == Refusal("conflict", f"cannot {action} an experiment in state {start}")


def test_an_unmanaged_experiment_refuses_every_action() -> None:
    """Nothing on the cluster acts on an unmanaged experiment, so even a no-op pause is refused."""
    decision = decide_state(experiment(unmanaged=True), ChangeState("pause", actor="a"))
    assert isinstance(decision, Refusal) and decision.reason == "conflict"
    assert "it is unmanaged" in decision.message


def test_archive_of_an_ended_experiment_records_it_once() -> None:
    """Archiving a COMPLETED experiment records ExperimentArchived; a second archive, nothing."""
    command = SetArchived(archived=True, actor="alice")
    assert decide_archived(experiment(lifecycle.COMPLETED), command) == [
        ExperimentArchived(experiment_id=EXP, archived=True, actor="alice")
    ]
    assert decide_archived(experiment(lifecycle.COMPLETED, archived=True), command) == []


def test_archive_of_a_running_experiment_is_a_conflict() -> None:
    """Only an ended experiment is archived or unarchived."""
    decision = decide_archived(experiment(), SetArchived(archived=False, actor="a"))
    assert decision == Refusal("conflict", "cannot unarchive an experiment in state ACTIVE")


def test_delete_moves_an_ended_experiment_to_deleting_once() -> None:
    """Deleting records DELETING ("deleted by user"); deleting a DELETING one decides nothing."""
    assert decide_delete(experiment(lifecycle.CANCELED), DeleteExperiment("alice")) == [
        ExperimentStateChanged(
            experiment_id=EXP, state=lifecycle.DELETING, reason="deleted by user", actor="alice"
        )
    ]
    assert decide_delete(experiment(lifecycle.DELETING), DeleteExperiment("alice")) == []


def test_delete_of_an_active_experiment_is_a_conflict() -> None:
    """An experiment still running cannot be deleted."""
    decision = decide_delete(experiment(), DeleteExperiment("alice"))
    assert decision == Refusal("conflict", "cannot delete an experiment in state ACTIVE")


def test_settings_record_one_fact_per_field_that_changes() -> None:
    """A new name, added labels and a new priority are three facts; an unchanged description and
    weight record nothing."""
    view = experiment(
        config={"name": "old", "description": "d", "labels": ["a"], "resources": {"weight": 1.0}}
    )
    command = ChangeSettings(
        actor="alice",
        name="new",
        description="d",
        add_labels=("b",),
        resources={"priority": 5, "weight": 1.0},
    )
    events = decide_settings(view, command)
    assert events == [
        ExperimentRenamed(experiment_id=EXP, name="new", actor="alice"),
        ExperimentLabelsChanged(
            experiment_id=EXP, labels=["a", "b"], added=["b"], removed=[], actor="alice"
        ),
        ExperimentResourcesChanged(experiment_id=EXP, resources={"priority": 5}, actor="alice"),
    ]


def test_settings_of_an_experiment_being_deleted_are_a_conflict() -> None:
    """While DELETING (or DELETED) nothing about an experiment changes."""
    decision = decide_settings(experiment(lifecycle.DELETING), ChangeSettings("a", name="x"))
    assert decision == Refusal("conflict", f"experiment {EXP} is DELETING; it cannot be changed")


@pytest.mark.parametrize(
    ("command", "field"),
    [
        (ChangeSettings("a", labels=tuple(f"l{i}" for i in range(MAX_LABELS + 1))), "labels"),
        (ChangeSettings("a", resources={"priority": None}), "resources.priority"),
        (ChangeSettings("a", resources={"weight": None}), "resources.weight"),
        (ChangeSettings("a", resources={"max_slots": 1}), "resources.max_slots"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(command: ChangeSettings, field: str) -> None:
    """Too many labels, a null priority or weight, and max_slots below slots_per_trial are
    invalid at their field."""
    view = experiment(config={"resources": {"slots_per_trial": 2}})
    decision = decide_settings(view, command)
    assert isinstance(decision, Refusal)
    assert (decision.reason, decision.field) == ("invalid", field)


def continuable(
    searcher: str = "single",
    states: dict[int, str] | None = None,
    *,
    checkpoints: dict[int, str] | None = None,
    deleted: frozenset[str] = frozenset(),
    **fields: Any,
) -> ContinueState:
    """An ended experiment with trials 11 (and 12 for a search) in ``states``."""
    states = states or {11: lifecycle.ERROR}
    trials_requested = {t: requested(t, i, lr=0.1) for i, t in enumerate(sorted(states), 1)}
    fields.setdefault("state", lifecycle.ERROR)
    view = experiment(config=config(searcher), trials=trials_requested, **fields)
    trials = {}
    for t in states:
        latest = (checkpoints or {}).get(t)
        saved = (
            None
            if latest is None
            else CheckpointSaved(trial_id=t, run_id=1, uuid=latest, steps_completed=5)
        )
        trials[t] = TrialView(t, version=4, latest_checkpoint=saved, state=states[t])
    return ContinueState(view, states, trials, deleted)


def test_continue_reopens_the_trials_that_did_not_complete_from_their_checkpoints() -> None:
    """A search continues its errored trial (not its completed one) from its latest checkpoint:
    ExperimentContinued on the experiment, TrialStateChanged ACTIVE on the trial."""
    state = continuable(
        "random", {11: lifecycle.COMPLETED, 12: lifecycle.ERROR}, checkpoints={12: "c-12"}
    )
    decision = decide_continue(state, ContinueExperiment("alice", {"max_restarts": 9}))
    assert isinstance(decision, Continuation)
    [continued] = decision.experiment
    assert isinstance(continued, ExperimentContinued)
    assert [t.trial_id for t in continued.trials] == [12]
    assert continued.config["max_restarts"] == 9 and continued.actor == "alice"
    assert decision.trials == {
        12: [TrialStateChanged(trial_id=12, state=lifecycle.ACTIVE, reason="continued by user")]
    }
    assert decision.latest_checkpoints == {12: "c-12"}


def test_continue_sets_a_single_trials_constant_hyperparameter() -> None:
    """A single-trial experiment may change a constant hyperparameter; the trial's recorded
    hparams carry the new value."""
    partial = {"hyperparameters": {"lr": 0.5}}
    decision = decide_continue(continuable(), ContinueExperiment("alice", partial))
    assert isinstance(decision, Continuation)
    [continued] = decision.experiment
    assert isinstance(continued, ExperimentContinued)
    assert continued.trials[0].hparams == {"lr": 0.5}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        (continuable(state=lifecycle.ACTIVE), "only an ended experiment"),
        (continuable(archived=True), "is archived; unarchive it first"),
        (continuable("adaptive_asha"), "whose decisions to stop trials are final"),
        (continuable("random", {11: lifecycle.ERROR, 12: lifecycle.ACTIVE}), "trial 12 is ACTIVE"),
        (continuable("random", {11: lifecycle.COMPLETED}), "there is nothing to continue"),
        (
            continuable(checkpoints={11: "c-1"}, deleted=frozenset({"c-1"})),
            "latest checkpoint c-1 was deleted",
        ),
    ],
)
def test_continue_is_a_conflict_when_the_experiment_cannot_go_on(
    state: ContinueState, message: str
) -> None:
    """Not ended, archived, ASHA, a trial still running, all completed, or a deleted latest
    checkpoint: each is a conflict saying which."""
    decision = decide_continue(state, ContinueExperiment("alice"))
    assert isinstance(decision, Refusal) and decision.reason == "conflict"
    assert message in decision.message


@pytest.mark.parametrize(
    ("searcher", "partial", "field"),
    [
        ("random", {"searcher": {"max_trials": 5}}, "config.searcher.max_trials"),
        ("single", {"max_restarts": -1}, "config.max_restarts"),
        (
            "single",
            {"hyperparameters": {"lr": {"type": "double", "minval": 0, "maxval": 1}}},
            "config.hyperparameters.lr",
        ),
    ],
)
def test_continue_with_a_config_it_may_not_change_is_invalid_at_the_path(
    searcher: str, partial: dict[str, Any], field: str
) -> None:
    """A search's searcher, an invalid value and a non-constant hyperparameter are refused as
    invalid, naming the ``config.`` path."""
    state = continuable(searcher, {11: lifecycle.ERROR, 12: lifecycle.ERROR})
    if searcher == "single":
        state = continuable()
    decision = decide_continue(state, ContinueExperiment("alice", partial))
    assert isinstance(decision, Refusal)
    assert (decision.reason, decision.field) == ("invalid", field)
