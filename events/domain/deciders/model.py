"""The model registry's deciders: create, edit, archive, move (between workspaces) and delete a
model; register, edit and delete its versions.

Each ``decide_*`` is pure over the model's folded stream
(:class:`~events.domain.aggregates.ModelView`) and a command. What a decider cannot see in the
model's own stream comes in the command or an argument, read by the caller from the log under
the registry lock (:mod:`events.domain.model_registry`): which model holds a name now, and the
state of the checkpoint a version is to point at. Who may act is the caller's check.

The rules on names and sizes are here, in one place: a model name is unique among existing
models (case-sensitive), not blank, holds no double space, no ``/`` or ``\\``, no control
character, is not all digits (a path of digits names a model by number) and is at most
:data:`MAX_NAME` characters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from events.domain.aggregates import ModelVersionView, ModelView
from events.domain.authorization import DEFAULT_NAME, DEFAULT_WORKSPACE_ID
from events.domain.deciders import Decision, Refusal, conflict, invalid, not_found
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

MAX_NAME = 255
"""Longest model or version name, in characters."""
MAX_DESCRIPTION = 10_000
"""Longest model description or version comment, in characters."""
MAX_NOTES = 65_536
"""Longest notes of a model or version, in characters."""
MAX_LABELS = 100
"""Most labels of a model or version."""
MAX_LABEL = 255
"""Longest label, in characters."""
MAX_METADATA_BYTES = 64 * 1024
"""Largest metadata of a model or version: its JSON, compact, in bytes."""
COMPLETED = "COMPLETED"
"""The one checkpoint state a version may point at."""


def model_name_problem(name: str) -> str | None:
    """What is wrong with ``name`` as a model name (``None``: nothing)."""
    if not name.strip():
        return "a model name must not be blank"
    if len(name) > MAX_NAME:
        return f"a model name is at most {MAX_NAME} characters (this one has {len(name)})"
    if "  " in name:
        return "a model name must not contain a double space"
    if "/" in name or "\\" in name:
        return "a model name must not contain '/' or '\\'"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a model name must not contain control characters"
    if name.isascii() and name.isdigit():
        return "a model name must not be all digits"
    return None


def _labels(labels: Iterable[str]) -> list[str]:
    """The labels without repeats, in their first order."""
    return list(dict.fromkeys(labels))


def _fields_problem(
    *,
    description: str,
    labels: list[str],
    metadata: Mapping[str, Any],
    notes: str,
    description_field: str = "description",
) -> Refusal | None:
    """The refusal of the first field over its bound (``None``: all within)."""
    if len(description) > MAX_DESCRIPTION:
        return invalid(
            f"{description_field}: at most {MAX_DESCRIPTION} characters", description_field
        )
    if len(notes) > MAX_NOTES:
        return invalid(f"notes: at most {MAX_NOTES} characters", "notes")
    if len(labels) > MAX_LABELS:
        return invalid(f"labels: at most {MAX_LABELS} labels", "labels")
    for i, label in enumerate(labels):
        if not label.strip() or len(label) > MAX_LABEL:
            return invalid(
                f"labels[{i}]: a label is 1 to {MAX_LABEL} characters, not blank", f"labels[{i}]"
            )
    size = len(json.dumps(metadata, separators=(",", ":")).encode())
    if size > MAX_METADATA_BYTES:
        return invalid(
            f"metadata: {size} bytes of JSON, over the limit of {MAX_METADATA_BYTES}", "metadata"
        )
    return None


def _missing(view: ModelView) -> Refusal | None:
    return None if view.exists else not_found(f"no model {view.model_id}")


def _archived(view: ModelView, what: str) -> Refusal | None:
    if view.archived:
        return conflict(f"model {view.name!r} is archived: unarchive it to {what}")
    return None


@dataclass(frozen=True)
class CreateModel:
    """Create model ``name`` as number ``model_id`` (a new number, taken by the caller)."""

    model_id: int
    name: str
    actor: str
    description: str = ""
    labels: tuple[str, ...] = ()
    metadata: Mapping[str, Any] | None = None
    notes: str = ""
    workspace_id: int = DEFAULT_WORKSPACE_ID
    workspace_name: str = DEFAULT_NAME
    workspace_archived: bool = False


def _archived_workspace(name: str, archived: bool) -> Refusal | None:
    if archived:
        return conflict(f"workspace {name!r} is archived: it takes no models", "workspace_name")
    return None


def decide_create_model(taken_by: int | None, command: CreateModel) -> Decision:
    """``ModelCreated`` in the command's workspace; refused when the name breaks a rule or a
    field is over its bound (invalid), or when model ``taken_by`` holds the name already or the
    workspace is archived (conflict).

    Args:
        taken_by: the existing model named ``command.name``, if there is one.
        command: what to create.
    """
    problem = model_name_problem(command.name)
    if problem is not None:
        return invalid(f"name: {problem}", "name")
    labels = _labels(command.labels)
    metadata = dict(command.metadata or {})
    refused = _fields_problem(
        description=command.description, labels=labels, metadata=metadata, notes=command.notes
    )
    if refused is not None:
        return refused
    if taken_by is not None:
        return conflict(f"name: a model named {command.name!r} exists already", "name")
    refused = _archived_workspace(command.workspace_name, command.workspace_archived)
    if refused is not None:
        return refused
    return [
        ModelCreated(
            model_id=command.model_id,
            name=command.name,
            description=command.description,
            labels=labels,
            metadata=metadata,
            notes=command.notes,
            owner=command.actor,
            workspace_id=command.workspace_id,
            actor=command.actor,
        )
    ]


@dataclass(frozen=True)
class EditModel:
    """Change a model's fields; ``None`` leaves a field as it is."""

    actor: str
    name: str | None = None
    description: str | None = None
    labels: tuple[str, ...] | None = None
    metadata: Mapping[str, Any] | None = None
    notes: str | None = None


def decide_edit_model(view: ModelView, command: EditModel, *, taken_by: int | None) -> Decision:
    """``ModelEdited`` with the fields after the change; ``[]`` when nothing changes; refused
    when the model is gone (not found) or archived (conflict), a field is invalid, or another
    model holds the new name (conflict).

    Args:
        view: the model.
        command: the change.
        taken_by: the existing model named ``command.name``, if a new name is given and one is.
    """
    refused = _missing(view) or _archived(view, "edit it")
    if refused is not None:
        return refused
    name = view.name if command.name is None else command.name
    if name != view.name:
        problem = model_name_problem(name)
        if problem is not None:
            return invalid(f"name: {problem}", "name")
    description = view.description if command.description is None else command.description
    labels = _labels(view.labels if command.labels is None else command.labels)
    metadata = dict(view.metadata if command.metadata is None else command.metadata)
    notes = view.notes if command.notes is None else command.notes
    refused = _fields_problem(
        description=description, labels=labels, metadata=metadata, notes=notes
    )
    if refused is not None:
        return refused
    if taken_by is not None and taken_by != view.model_id:
        return conflict(f"name: a model named {name!r} exists already", "name")
    after = (name, description, labels, metadata, notes)
    if after == (view.name, view.description, view.labels, view.metadata, view.notes):
        return []
    return [
        ModelEdited(
            model_id=view.model_id,
            name=name,
            description=description,
            labels=labels,
            metadata=metadata,
            notes=notes,
            actor=command.actor,
        )
    ]


@dataclass(frozen=True)
class SetModelArchived:
    """Archive (``archived``) or unarchive a model."""

    archived: bool
    actor: str


def decide_model_archived(view: ModelView, command: SetModelArchived) -> Decision:
    """``ModelArchived``; ``[]`` when it is so already; refused (not found) when it is gone."""
    refused = _missing(view)
    if refused is not None:
        return refused
    if view.archived == command.archived:
        return []
    return [ModelArchived(model_id=view.model_id, archived=command.archived, actor=command.actor)]


@dataclass(frozen=True)
class MoveModel:
    """Move a model to workspace ``workspace_id`` (named ``workspace_name``; ``archived``: the
    caller read it archived)."""

    workspace_id: int
    workspace_name: str
    actor: str
    workspace_archived: bool = False


def decide_move_model(view: ModelView, command: MoveModel) -> Decision:
    """``ModelMoved``; ``[]`` when the model is there already; refused when the model is gone
    (not found) or the workspace it goes to is archived (conflict). An archived model moves:
    moving changes where it is, none of its fields."""
    refused = _missing(view)
    if refused is not None:
        return refused
    if view.workspace_id == command.workspace_id:
        return []
    refused = _archived_workspace(command.workspace_name, command.workspace_archived)
    if refused is not None:
        return refused
    return [
        ModelMoved(
            model_id=view.model_id,
            from_workspace_id=view.workspace_id,
            to_workspace_id=command.workspace_id,
            actor=command.actor,
        )
    ]


@dataclass(frozen=True)
class DeleteModel:
    """Delete a model and its versions."""

    actor: str


def decide_delete_model(view: ModelView, command: DeleteModel) -> Decision:
    """``ModelDeleted``; refused (not found) when the model is gone already."""
    refused = _missing(view)
    if refused is not None:
        return refused
    return [ModelDeleted(model_id=view.model_id, name=view.name, actor=command.actor)]


@dataclass(frozen=True)
class RegisterVersion:
    """Register checkpoint ``checkpoint_uuid`` as the model's next version.

    ``experiment_id``, ``trial_id`` and ``checkpoint_state`` are the checkpoint's as the caller
    read them from the log (``DELETED`` once it is deleted or its experiment is being deleted).
    """

    checkpoint_uuid: str
    experiment_id: int
    trial_id: int
    checkpoint_state: str
    creator: str
    name: str = ""
    comment: str = ""
    labels: tuple[str, ...] = ()
    metadata: Mapping[str, Any] | None = None
    notes: str = ""


def decide_register_version(view: ModelView, command: RegisterVersion) -> Decision:
    """``ModelVersionRegistered`` numbered one above the highest version the model ever had;
    refused when the model is gone (not found) or archived, or the checkpoint is not COMPLETED
    (conflict), or a field is invalid."""
    refused = _missing(view) or _archived(view, "register versions")
    if refused is not None:
        return refused
    if command.checkpoint_state != COMPLETED:
        return conflict(
            f"checkpoint_uuid: checkpoint {command.checkpoint_uuid} is "
            f"{command.checkpoint_state}; only a COMPLETED checkpoint can be registered",
            "checkpoint_uuid",
        )
    if len(command.name) > MAX_NAME:
        return invalid(f"name: at most {MAX_NAME} characters", "name")
    labels = _labels(command.labels)
    metadata = dict(command.metadata or {})
    refused = _fields_problem(
        description=command.comment,
        labels=labels,
        metadata=metadata,
        notes=command.notes,
        description_field="comment",
    )
    if refused is not None:
        return refused
    return [
        ModelVersionRegistered(
            model_id=view.model_id,
            version=view.next_version,
            checkpoint_uuid=command.checkpoint_uuid,
            experiment_id=command.experiment_id,
            trial_id=command.trial_id,
            name=command.name,
            comment=command.comment,
            labels=labels,
            metadata=metadata,
            notes=command.notes,
            creator=command.creator,
        )
    ]


LATEST = -1
"""The version number that names a model's latest version."""


def _version(view: ModelView, version: int) -> ModelVersionView | Refusal:
    number = max(view.versions, default=None) if version == LATEST else version
    found = view.versions.get(number) if number is not None else None
    if found is None:
        return not_found(f"model {view.name!r} has no version {version}")
    return found


@dataclass(frozen=True)
class EditVersion:
    """Change a version's fields (never its checkpoint); ``None`` leaves a field as it is.

    ``version`` is a number or :data:`LATEST`; ``checkpoint_uuid``, when given, must be the
    version's own (a version never points at another checkpoint).
    """

    version: int
    actor: str
    name: str | None = None
    comment: str | None = None
    labels: tuple[str, ...] | None = None
    metadata: Mapping[str, Any] | None = None
    notes: str | None = None
    checkpoint_uuid: str | None = None


def decide_edit_version(view: ModelView, command: EditVersion) -> Decision:
    """``ModelVersionEdited`` with the fields after the change; ``[]`` when nothing changes;
    refused when the model or version is gone (not found), the model is archived (conflict), a
    field is invalid or the command would point the version at another checkpoint."""
    refused = _missing(view) or _archived(view, "edit its versions")
    if refused is not None:
        return refused
    found = _version(view, command.version)
    if isinstance(found, Refusal):
        return found
    if command.checkpoint_uuid is not None and command.checkpoint_uuid != found.checkpoint_uuid:
        return invalid(
            "checkpoint_uuid: a version never points at another checkpoint; register a new "
            "version instead",
            "checkpoint_uuid",
        )
    name = found.name if command.name is None else command.name
    if len(name) > MAX_NAME:
        return invalid(f"name: at most {MAX_NAME} characters", "name")
    comment = found.comment if command.comment is None else command.comment
    labels = _labels(found.labels if command.labels is None else command.labels)
    metadata = dict(found.metadata if command.metadata is None else command.metadata)
    notes = found.notes if command.notes is None else command.notes
    refused = _fields_problem(
        description=comment,
        labels=labels,
        metadata=metadata,
        notes=notes,
        description_field="comment",
    )
    if refused is not None:
        return refused
    if (name, comment, labels, metadata, notes) == (
        found.name,
        found.comment,
        found.labels,
        found.metadata,
        found.notes,
    ):
        return []
    return [
        ModelVersionEdited(
            model_id=view.model_id,
            version=found.version,
            name=name,
            comment=comment,
            labels=labels,
            metadata=metadata,
            notes=notes,
            actor=command.actor,
        )
    ]


@dataclass(frozen=True)
class DeleteVersion:
    """Delete one version of a model (a number or :data:`LATEST`)."""

    version: int
    actor: str


def decide_delete_version(view: ModelView, command: DeleteVersion) -> Decision:
    """``ModelVersionDeleted``; refused (not found) when the model or version is gone."""
    refused = _missing(view)
    if refused is not None:
        return refused
    found = _version(view, command.version)
    if isinstance(found, Refusal):
        return found
    return [
        ModelVersionDeleted(
            model_id=view.model_id,
            version=found.version,
            checkpoint_uuid=found.checkpoint_uuid,
            experiment_id=found.experiment_id,
            actor=command.actor,
        )
    ]
