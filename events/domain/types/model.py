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

from events.domain.authorization import DEFAULT_WORKSPACE_ID
from events.log.envelope import Event
from events.log.registry import register, upcaster

DEFAULT_WORKSPACE = "Uncategorized"
"""The name of the default workspace, where version 1 of ``ModelCreated`` put every model."""


@register
class ModelCreated(Event):
    """Model ``name`` was created by ``owner``, as number ``model_id``, in workspace
    ``workspace_id``.

    Version 2 names the workspace by id; version 1 named it (``workspace``), and the name was
    always the default workspace's, so it upcasts to id 1. ``ModelMoved`` moves it later.
    """

    event_type = "ModelCreated"
    schema_version = 2

    model_id: int
    name: str
    description: str = ""
    labels: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    notes: str = ""
    owner: str
    workspace_id: int = DEFAULT_WORKSPACE_ID
    actor: str = ""


@upcaster("ModelCreated", 1)
def _model_created_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """Version 1's workspace name (only ever the default workspace's) becomes its id."""
    out = {k: v for k, v in payload.items() if k != "workspace"}
    out["workspace_id"] = DEFAULT_WORKSPACE_ID
    return out


@register
class ModelMoved(Event):
    """The model moved from workspace ``from_workspace_id`` to ``to_workspace_id``; its
    versions go with it, and from now on the roles of the new workspace decide who may read or
    change it."""

    event_type = "ModelMoved"

    model_id: int
    from_workspace_id: int
    to_workspace_id: int
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
