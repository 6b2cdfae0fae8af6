"""Facts on a registered model's stream (``model-<model_id>``): the model registry.

A model is a named collection of numbered versions, each pointing at one completed checkpoint.
Its number ``model_id`` is taken when it is created and never reused; its name is unique among
the models that exist. Versions are numbered 1, 2, ... per model, never reused either (a deleted
version's number stays taken), and a version never points at another checkpoint. While a
version exists its checkpoint is kept: checkpoint GC skips it, and deleting it or its
experiment is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from events.log.envelope import Event
from events.log.registry import register

DEFAULT_WORKSPACE = "Uncategorized"
"""The workspace every model is in until workspaces exist."""


@register
class ModelCreated(Event):
    """Model ``name`` was created by ``owner``, as number ``model_id``."""

    event_type = "ModelCreated"

    model_id: int
    name: str
    description: str = ""
    labels: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""
    owner: str
    workspace: str = DEFAULT_WORKSPACE
    actor: str = ""


@register
class ModelEdited(Event):
    """The model's editable fields are now these (the whole set, not only what changed)."""

    event_type = "ModelEdited"

    model_id: int
    name: str
    description: str
    labels: list[str]
    metadata: dict[str, Any]
    notes: str
    actor: str = ""


@register
class ModelArchived(Event):
    """The model was archived (``archived``) or unarchived; an archived one takes no edits and
    no new versions."""

    event_type = "ModelArchived"

    model_id: int
    archived: bool
    actor: str = ""


@register
class ModelDeleted(Event):
    """The model ``name`` was deleted with every version it had; its checkpoints are no longer
    kept for it."""

    event_type = "ModelDeleted"

    model_id: int
    name: str
    actor: str = ""


@register
class ModelVersionRegistered(Event):
    """Version ``version`` of the model points at checkpoint ``checkpoint_uuid``, saved by
    trial ``trial_id`` of experiment ``experiment_id``; ``creator`` registered it."""

    event_type = "ModelVersionRegistered"

    model_id: int
    version: int
    checkpoint_uuid: str
    experiment_id: int
    trial_id: int
    name: str = ""
    comment: str = ""
    labels: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""
    creator: str


@register
class ModelVersionEdited(Event):
    """The version's editable fields are now these (its checkpoint never changes)."""

    event_type = "ModelVersionEdited"

    model_id: int
    version: int
    name: str
    comment: str
    labels: list[str]
    metadata: dict[str, Any]
    notes: str
    actor: str = ""


@register
class ModelVersionDeleted(Event):
    """Version ``version`` was deleted; checkpoint ``checkpoint_uuid`` of experiment
    ``experiment_id`` is no longer kept for it."""

    event_type = "ModelVersionDeleted"

    model_id: int
    version: int
    checkpoint_uuid: str
    experiment_id: int
    actor: str = ""
