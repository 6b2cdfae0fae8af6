"""The model registry's deciders (:mod:`events.domain.deciders.model`) and fold
(:mod:`events.domain.aggregates.model`), and the refusals a registration adds to deleting an
experiment or its checkpoints; no HTTP, no database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from events.domain import lifecycle
from events.domain.aggregates import ExperimentView, ModelView, fold_model
from events.domain.deciders import Refusal
from events.domain.deciders.checkpoint import DeleteCheckpoints, decide_delete_checkpoints
from events.domain.deciders.experiment import DeleteExperiment, decide_delete
from events.domain.deciders.model import (
    LATEST,
    MAX_METADATA_BYTES,
    CreateModel,
    DeleteVersion,
    EditModel,
    EditVersion,
    MoveModel,
    RegisterVersion,
    SetModelArchived,
    decide_create_model,
    decide_delete_model,
    decide_delete_version,
    decide_edit_model,
    decide_edit_version,
    decide_model_archived,
    decide_move_model,
    decide_register_version,
    model_name_problem,
)
from events.domain.deciders.model import DeleteModel as DeleteModelCommand
from events.domain.types import ModelCreated, ModelVersionRegistered
from events.log.envelope import Event, Metadata, RecordedEvent
from events.log.registry import encode


def recorded(events: list[Event]) -> list[RecordedEvent]:
    """The events as a stream ``model-1`` recorded them."""
    return [
        RecordedEvent(
            position=i,
            stream_id="model-1",
            stream_version=i,
            event_id=uuid.uuid4(),
            type=e.event_type,
            schema_version=e.schema_version,
            payload=encode(e),
            metadata=Metadata(),
            recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for i, e in enumerate(events, start=1)
    ]


class Stream:
    """A model's stream in memory: what its deciders appended, folded on each append."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.view = ModelView(1)

    def add(self, decision: list[Event] | Refusal) -> ModelView:
        """Appends a decision (which must not be a refusal); returns the model folded again."""
        assert not isinstance(decision, Refusal), decision
        self.events += decision
        self.view = fold_model(1, recorded(self.events))
        return self.view


def created(**fields: Any) -> Stream:
    stream = Stream()
    command = CreateModel(model_id=1, name="mnist", actor="alice", **fields)
    stream.add(decide_create_model(None, command))
    return stream


def register(view: ModelView, uuid_: str = "c1", state: str = "COMPLETED") -> list[Event] | Refusal:
    command = RegisterVersion(
        checkpoint_uuid=uuid_, experiment_id=7, trial_id=17, checkpoint_state=state, creator="alice"
    )
    return decide_register_version(view, command)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "blank"),
        ("  ", "blank"),
        ("a  b", "double space"),
        ("a/b", "'/'"),
        ("a\\b", "'/'"),
        ("123", "all digits"),
        ("x" * 256, "at most 255"),
        ("a\nb", "control"),
    ],
)
def test_model_names_follow_determineds_rules(name: str, problem: str) -> None:
    """Blank, double-spaced, slashed, all-digit, overlong and control-character names are
    refused naming the rule."""
    found = model_name_problem(name)
    assert found is not None and problem in found


def test_good_names_pass_and_a_taken_name_is_a_conflict() -> None:
    """Spaces, digits among letters and unicode are fine; a name another model holds is 409."""
    for name in ("mnist cnn", "v2", "modèle", "1a"):
        assert model_name_problem(name) is None
    refusal = decide_create_model(3, CreateModel(model_id=4, name="mnist", actor="bob"))
    assert isinstance(refusal, Refusal) and refusal.reason == "conflict"


def test_creation_deduplicates_labels_and_bounds_metadata() -> None:
    """Labels keep their first order without repeats; metadata over its bound is invalid."""
    view = created(labels=("b", "a", "b")).view
    assert view.labels == ["b", "a"] and view.owner == "alice"
    big = {"blob": "x" * MAX_METADATA_BYTES}
    refusal = decide_create_model(None, CreateModel(model_id=1, name="m", actor="a", metadata=big))
    assert isinstance(refusal, Refusal) and refusal.field == "metadata"


def test_version_numbers_are_never_given_twice() -> None:
    """Versions 1 and 2, delete 2, next is 3; LATEST names the highest live one."""
    stream = created()
    stream.add(register(stream.view, "c1"))
    stream.add(register(stream.view, "c2"))
    stream.add(decide_delete_version(stream.view, DeleteVersion(version=2, actor="alice")))
    view = stream.add(register(stream.view, "c2"))
    assert sorted(view.versions) == [1, 3]
    edited = decide_edit_version(view, EditVersion(version=LATEST, actor="a", comment="hi"))
    assert not isinstance(edited, Refusal) and edited[0].version == 3  # type: ignore[attr-defined]


def test_a_version_never_repoints_and_an_archived_model_refuses_changes() -> None:
    """Naming another checkpoint in an edit is invalid; once archived, edits and registrations
    are conflicts; a checkpoint that is not COMPLETED is a conflict on checkpoint_uuid."""
    stream = created()
    view = stream.add(register(stream.view, "c1"))
    moved = decide_edit_version(view, EditVersion(version=1, actor="a", checkpoint_uuid="c9"))
    assert isinstance(moved, Refusal) and moved.field == "checkpoint_uuid"
    deleted = register(view, "c2", state="DELETED")
    assert isinstance(deleted, Refusal) and deleted.field == "checkpoint_uuid"
    view = stream.add(decide_model_archived(view, SetModelArchived(archived=True, actor="a")))
    for refusal in (
        register(view, "c2"),
        decide_edit_model(view, EditModel(actor="a", notes="n"), taken_by=None),
        decide_edit_version(view, EditVersion(version=1, actor="a", comment="c")),
    ):
        assert isinstance(refusal, Refusal) and refusal.reason == "conflict"
        assert "archived" in refusal.message


def test_a_model_is_created_in_its_workspace_and_moves_between_workspaces() -> None:
    """A model is created in the command's workspace (not in an archived one), moves with
    ModelMoved (the fold follows; a move where it is appends nothing), and never moves into an
    archived workspace."""
    refused = decide_create_model(
        None,
        CreateModel(
            model_id=1,
            name="m",
            actor="a",
            workspace_id=3,
            workspace_name="old",
            workspace_archived=True,
        ),
    )
    assert (
        isinstance(refused, Refusal) and refused.reason == "conflict" and "'old'" in refused.message
    )
    stream = created(workspace_id=2, workspace_name="vision")
    assert stream.view.workspace_id == 2
    move = MoveModel(workspace_id=3, workspace_name="speech", actor="bob")
    view = stream.add(decide_move_model(stream.view, move))
    assert view.workspace_id == 3 and stream.events[-1].model_dump()["from_workspace_id"] == 2
    assert decide_move_model(view, move) == []
    back = MoveModel(workspace_id=2, workspace_name="vision", actor="b", workspace_archived=True)
    refused = decide_move_model(view, back)
    assert isinstance(refused, Refusal) and refused.reason == "conflict"
    stream.add(decide_delete_model(view, DeleteModelCommand(actor="a")))
    gone = decide_move_model(stream.view, back)
    assert isinstance(gone, Refusal) and gone.reason == "not_found"


def test_a_deleted_model_stays_deleted_in_the_fold() -> None:
    """After ModelDeleted nothing of the stream brings the model or a version back."""
    stream = created()
    stream.add(register(stream.view, "c1"))
    view = stream.add(decide_delete_model(stream.view, DeleteModelCommand(actor="alice")))
    assert not view.exists and view.versions == {}
    late = [
        ModelCreated(model_id=1, name="again", owner="bob"),
        ModelVersionRegistered(
            model_id=1, version=9, checkpoint_uuid="c", experiment_id=1, trial_id=1, creator="b"
        ),
    ]
    view = stream.add(late)
    assert not view.exists and view.versions == {}


def test_registered_checkpoints_refuse_experiment_and_checkpoint_deletion() -> None:
    """Deleting an ended experiment or its checkpoints while a version keeps one is a conflict
    naming it; a running experiment still gets the running refusal first."""
    names = ("model 'mnist' version 1 (checkpoint c1)",)
    ended = ExperimentView(7, state=lifecycle.COMPLETED)
    for refusal in (
        decide_delete(ended, DeleteExperiment("alice", registered=names)),
        decide_delete_checkpoints(ended, DeleteCheckpoints(("c1",), "alice", registered=names)),
    ):
        assert isinstance(refusal, Refusal) and refusal.code == "checkpoints_registered"
        assert names[0] in refusal.message
    running = decide_delete(ExperimentView(7, state=lifecycle.ACTIVE), DeleteExperiment("a", names))
    assert isinstance(running, Refusal) and "state ACTIVE" in running.message
