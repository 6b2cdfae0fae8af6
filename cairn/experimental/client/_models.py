"""The model registry in the SDK: :class:`Model` and its numbered :class:`ModelVersion`\\ s,
with Determined's names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from cairn.client import ApiError, Client
from cairn.experimental.client._checkpoints import Checkpoint
from cairn.experimental.client._records import _MasterObject, _time
from cairn.experimental.client._states import OrderBy


class ModelVersion(_MasterObject):
    """One version of a model: a checkpoint registered under a number (get one with
    :meth:`Model.get_version` or :meth:`Model.register_version`).

    Attributes:
        model_id: the model's number.
        model_name: the model's name.
        model_version: the version's number (1, 2, ...; never given twice).
        name: the version's name.
        comment: its comment.
        notes: its notes.
        labels: its labels.
        metadata: its metadata.
        checkpoint_uuid: the checkpoint it points at (never changes).
        username: who registered it.
        creation_time: when.
        last_updated_time: when it last changed.
    """

    def __init__(
        self, session: Client, model_name: str, version: int, data: Mapping[str, Any] | None
    ) -> None:
        self.model_name = model_name
        self.model_version = version
        super().__init__(session, data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        model = data.get("model") or {}
        ckpt = data.get("checkpoint") or {}
        self.model_id = int(model.get("id") or 0)
        self.model_name = str(model.get("name") or self.model_name)
        self.model_version = int(data.get("version") or self.model_version)
        self.name: str = str(data.get("name") or "")
        self.comment: str = str(data.get("comment") or "")
        self.notes: str = str(data.get("notes") or "")
        self.labels: list[str] = list(data.get("labels") or [])
        self.metadata: dict[str, Any] = dict(data.get("metadata") or {})
        self.checkpoint_uuid = str(ckpt.get("uuid") or "")
        self.username = str(data.get("username") or "")
        self.creation_time: datetime | None = _time(data.get("creation_time"))
        self.last_updated_time: datetime | None = _time(data.get("last_updated_time"))

    @property
    def _model_ref(self) -> str:
        return str(self.model_id) if getattr(self, "model_id", 0) else self.model_name

    def reload(self) -> None:
        """Reads the version again from the master."""
        self._hydrate(self._session.get_model_version(self._model_ref, self.model_version))

    @property
    def checkpoint(self) -> Checkpoint:
        """The checkpoint it points at (``.download()`` fetches its files; reading it needs
        the right to read its experiment)."""
        return Checkpoint(self._session, self.checkpoint_uuid)

    def _patch(self, changes: dict[str, Any]) -> None:
        data = self._session.patch_model_version(self._model_ref, self.model_version, changes)
        self._hydrate(data)

    def set_name(self, name: str) -> None:
        """Renames the version."""
        self._patch({"name": name})

    def set_notes(self, notes: str) -> None:
        """Replaces the version's notes."""
        self._patch({"notes": notes})

    def add_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Merges ``metadata``'s top-level keys into the version's metadata."""
        self._patch({"metadata": {**self.metadata, **dict(metadata)}})

    def remove_metadata(self, keys: Iterable[str]) -> None:
        """Removes top-level keys from the version's metadata."""
        gone = set(keys)
        self._patch({"metadata": {k: v for k, v in self.metadata.items() if k not in gone}})

    def delete(self) -> None:
        """Deletes the version (its checkpoint is no longer kept for it)."""
        self._session.delete_model_version(self._model_ref, self.model_version)

    def __repr__(self) -> str:
        return f"ModelVersion(model_name={self.model_name!r}, model_version={self.model_version})"


class Model(_MasterObject):
    """A registered model (get one with :meth:`Determined.get_model` or make one with
    :meth:`Determined.create_model`).

    Attributes:
        model_id: its number.
        name: its name (unique among models, case-sensitive).
        description: what it is.
        labels: its labels.
        metadata: its metadata.
        notes: its notes.
        username: who created it (its owner).
        workspace_id: its workspace's id.
        workspace: its workspace's name.
        archived: whether it is archived (no edits, no new versions).
        creation_time: when it was created.
        last_updated_time: when it last changed.
    """

    def __init__(self, session: Client, name: str, data: Mapping[str, Any] | None = None) -> None:
        self.name = name
        super().__init__(session, data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        self.model_id = int(data.get("id") or 0)
        self.name = str(data.get("name") or self.name)
        self.description: str = str(data.get("description") or "")
        self.labels: list[str] = list(data.get("labels") or [])
        self.metadata: dict[str, Any] = dict(data.get("metadata") or {})
        self.notes: str = str(data.get("notes") or "")
        self.username = str(data.get("username") or "")
        self.workspace_id = int(data.get("workspace_id") or 1)
        self.workspace = str(data.get("workspace") or "")
        self.archived = bool(data.get("archived"))
        self.creation_time: datetime | None = _time(data.get("creation_time"))
        self.last_updated_time: datetime | None = _time(data.get("last_updated_time"))

    def reload(self) -> None:
        """Reads the model again from the master."""
        self._hydrate(self._session.get_model(self._ref))

    @property
    def _ref(self) -> str:
        """How paths name it: by number once known (a rename elsewhere cannot lose it)."""
        return str(self.model_id) if getattr(self, "model_id", 0) else self.name

    def register_version(self, checkpoint_uuid: str) -> ModelVersion:
        """Registers a completed checkpoint as the next version and returns it.

        Raises:
            ApiError: the checkpoint is unknown (404), not yours to read (403), not COMPLETED
                or the model is archived (409).
        """
        data = self._session.register_model_version(self._ref, checkpoint_uuid)
        return ModelVersion(self._session, self.name, int(data["version"]), data)

    def get_version(self, version: int = -1) -> ModelVersion | None:
        """Version ``version`` (``-1``: the latest), or ``None`` when there is no such one."""
        try:
            data = self._session.get_model_version(self._ref, version)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return ModelVersion(self._session, self.name, int(data["version"]), data)

    def get_versions(self, order_by: OrderBy = OrderBy.DESCENDING) -> list[ModelVersion]:
        """Every version, newest first (``OrderBy.ASCENDING``: oldest first)."""
        data = self._session.list_model_versions(self._ref)
        versions = [
            ModelVersion(self._session, self.name, int(v["version"]), v)
            for v in data.get("model_versions") or []
        ]
        descending = order_by in (OrderBy.DESCENDING, OrderBy.DESC)
        return sorted(versions, key=lambda v: v.model_version, reverse=descending)

    def _patch(self, changes: dict[str, Any]) -> None:
        self._hydrate(self._session.patch_model(self._ref, changes))

    def set_description(self, description: str) -> None:
        """Replaces the description."""
        self._patch({"description": description})

    def set_labels(self, labels: Iterable[str]) -> None:
        """Replaces the labels (repeats are dropped)."""
        self._patch({"labels": list(labels)})

    def add_label(self, label: str) -> None:
        """Adds a label."""
        self.set_labels([*self.labels, label])

    def remove_label(self, label: str) -> None:
        """Removes a label."""
        self.set_labels([x for x in self.labels if x != label])

    def add_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Merges ``metadata``'s top-level keys into the model's metadata."""
        self._patch({"metadata": {**self.metadata, **dict(metadata)}})

    def remove_metadata(self, keys: Iterable[str]) -> None:
        """Removes top-level keys from the model's metadata."""
        gone = set(keys)
        self._patch({"metadata": {k: v for k, v in self.metadata.items() if k not in gone}})

    def move_to_workspace(self, workspace_name: str) -> None:
        """Moves the model, with its versions, to workspace ``workspace_name``.

        Raises:
            ApiError: no such workspace (400), you may not take the model out of its workspace
                or create models in that one (403), or that one is archived (409).
        """
        self._hydrate(self._session.move_model(self._ref, workspace_name=workspace_name))

    def archive(self) -> None:
        """Archives the model (no edits and no new versions until unarchived)."""
        self._hydrate(self._session.set_model_archived(self._ref, True))

    def unarchive(self) -> None:
        """Unarchives the model."""
        self._hydrate(self._session.set_model_archived(self._ref, False))

    def delete(self) -> None:
        """Deletes the model and every version of it."""
        self._session.delete_model(self._ref)

    def __repr__(self) -> str:
        return f"Model(name={self.name!r}, model_id={self.model_id})"
