"""The registered model fold: a model's fields, archive flag and numbered versions.

A model exists from ``ModelCreated`` until ``ModelDeleted``, in the workspace it was created in
or last moved to (``ModelMoved``); nothing after the deletion changes it (a new model of the same name is another stream). ``next_version`` is one more than the
highest version ever registered, so a deleted version's number is never given again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events.domain.authorization import DEFAULT_WORKSPACE_ID
from events.domain.types import (
    ModelArchived,
    ModelCreated,
    ModelDeleted,
    ModelEdited,
    ModelMoved,
    ModelVersionDeleted,
    ModelVersionEdited,
    ModelVersionRegistered,
)
from events.log.envelope import Event, RecordedEvent

MODEL_FACTS = (
    "ModelCreated",
    "ModelEdited",
    "ModelArchived",
    "ModelDeleted",
    "ModelMoved",
    "ModelVersionRegistered",
    "ModelVersionEdited",
    "ModelVersionDeleted",
)
"""What :func:`apply_model` reads."""


@dataclass
class ModelVersionView:
    """One live version of a model."""

    version: int
    checkpoint_uuid: str
    experiment_id: int
    trial_id: int
    creator: str
    name: str = ""
    comment: str = ""
    labels: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass
class ModelView:
    """A model's stream folded."""

    model_id: int
    version: int = 0
    exists: bool = False
    deleted: bool = False
    name: str = ""
    description: str = ""
    labels: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    owner: str = ""
    workspace_id: int = DEFAULT_WORKSPACE_ID
    archived: bool = False
    created_at: datetime | None = None
    updated_at: datetime | None = None
    versions: dict[int, ModelVersionView] = field(default_factory=dict)
    next_version: int = 1


def apply_model(view: ModelView, recorded: RecordedEvent, event: Event | None = None) -> None:
    """Folds one event of the model's stream (``event``: ``recorded`` already decoded)."""
    view.version = recorded.stream_version
    if recorded.type not in MODEL_FACTS:
        return
    if event is None:
        event = recorded.decode()
    at = recorded.recorded_at
    if isinstance(event, ModelCreated):
        if view.exists or view.deleted:
            return
        view.exists = True
        view.name = event.name
        view.description = event.description
        view.labels = list(event.labels)
        view.metadata = dict(event.metadata)
        view.notes = event.notes
        view.owner = event.owner
        view.workspace_id = event.workspace_id
        view.created_at = view.updated_at = at
        return
    if not view.exists:
        return
    view.updated_at = at
    if isinstance(event, ModelEdited):
        view.name = event.name
        view.description = event.description
        view.labels = list(event.labels)
        view.metadata = dict(event.metadata)
        view.notes = event.notes
    elif isinstance(event, ModelArchived):
        view.archived = event.archived
    elif isinstance(event, ModelMoved):
        view.workspace_id = event.to_workspace_id
    elif isinstance(event, ModelDeleted):
        view.exists = False
        view.deleted = True
        view.versions = {}
    elif isinstance(event, ModelVersionRegistered):
        if event.version < view.next_version:
            return  # a number is given once
        view.versions[event.version] = ModelVersionView(
            version=event.version,
            checkpoint_uuid=event.checkpoint_uuid,
            experiment_id=event.experiment_id,
            trial_id=event.trial_id,
            creator=event.creator,
            name=event.name,
            comment=event.comment,
            labels=list(event.labels),
            metadata=dict(event.metadata),
            notes=event.notes,
            created_at=at,
            updated_at=at,
        )
        view.next_version = event.version + 1
    elif isinstance(event, ModelVersionEdited):
        found = view.versions.get(event.version)
        if found is not None:
            found.name = event.name
            found.comment = event.comment
            found.labels = list(event.labels)
            found.metadata = dict(event.metadata)
            found.notes = event.notes
            found.updated_at = at
    elif isinstance(event, ModelVersionDeleted):
        view.versions.pop(event.version, None)


def fold_model(model_id: int, events: Iterable[RecordedEvent]) -> ModelView:
    """Folds a model's stream (events of :data:`MODEL_FACTS`; others only move ``version``)."""
    view = ModelView(model_id)
    for recorded in events:
        apply_model(view, recorded)
    return view
