"""The envelope every stored event travels in, and the base class of event payloads."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field


class Event(BaseModel):
    """Base of every event payload: a frozen fact with a stable type name and schema version.

    Subclasses set ``event_type`` (never renamed once stored) and ``schema_version`` (bumped with an
    upcaster in :mod:`events.registry` whenever the payload shape changes).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_type: ClassVar[str]
    schema_version: ClassVar[int] = 1


class Metadata(BaseModel):
    """Who caused an event and why: actor, causation and correlation ids, leader epoch."""

    model_config = ConfigDict(frozen=True, extra="allow")

    actor: str | None = None
    causation_id: str | None = None
    correlation_id: str | None = None
    epoch: int | None = None


_METADATA_FIELDS = ("actor", "causation_id", "correlation_id", "epoch")
_EMPTY_METADATA = Metadata()  # frozen, so one instance serves every event without metadata
_Model = TypeVar("_Model", bound=BaseModel)


def trusted_metadata(stored: dict[str, Any] | None) -> Metadata:
    """Metadata as the store wrote it, without validation (see :meth:`RecordedEvent.trusted`)."""
    if not stored:
        return _EMPTY_METADATA
    values = {name: stored.get(name) for name in _METADATA_FIELDS}
    extra = {k: v for k, v in stored.items() if k not in values}
    return _trusted(Metadata, values, extra, fields_set=set(stored))


def _trusted(
    cls: type[_Model],
    values: dict[str, Any],
    extra: dict[str, Any] | None,
    *,
    fields_set: set[str] | None = None,
) -> _Model:
    """An instance of pydantic model ``cls`` holding ``values`` as they are (no validation)."""
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", values)
    object.__setattr__(
        obj, "__pydantic_fields_set__", set(values) if fields_set is None else fields_set
    )
    object.__setattr__(obj, "__pydantic_extra__", extra)
    object.__setattr__(obj, "__pydantic_private__", None)
    return obj


class NewEvent(BaseModel):
    """An event about to be appended: the payload plus its id and metadata."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    event: Event
    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    metadata: Metadata = Field(default_factory=Metadata)


class RecordedEvent(BaseModel):
    """An event as stored in the log, with its global position and stream version.

    ``payload`` is the JSON as stored, upcast (by :func:`events.store.row_to_event`) to the
    current schema version when its type has upcasters from the stored one; :meth:`decode`
    validates it into the current model.
    """

    model_config = ConfigDict(frozen=True)

    position: int
    stream_id: str
    stream_version: int
    event_id: uuid.UUID
    type: str
    schema_version: int
    payload: dict[str, Any]
    metadata: Metadata
    recorded_at: datetime

    @property
    def stream_type(self) -> str:
        """The stream's category: the part of ``stream_id`` before the first ``-``."""
        return stream_type_of(self.stream_id)

    @classmethod
    def trusted(
        cls,
        *,
        position: int,
        stream_id: str,
        stream_version: int,
        event_id: uuid.UUID,
        type: str,
        schema_version: int,
        payload: dict[str, Any],
        metadata: Metadata,
        recorded_at: datetime,
    ) -> RecordedEvent:
        """Builds a recorded event from values the store itself wrote, without validation.

        Replay builds one per stored event, so this skips even ``model_construct``'s default
        handling (every field is given); only the store may call it, with its own rows.
        """
        return _trusted(
            cls,
            {
                "position": position,
                "stream_id": stream_id,
                "stream_version": stream_version,
                "event_id": event_id,
                "type": type,
                "schema_version": schema_version,
                "payload": payload,
                "metadata": metadata,
                "recorded_at": recorded_at,
            },
            None,
        )

    def decode(self) -> Event:
        """Returns the payload as the current version of its event model."""
        from events.registry import decode

        return decode(self.type, self.schema_version, self.payload)


def stream_type_of(stream_id: str) -> str:
    """Returns the category of a stream id (``trial-42`` -> ``trial``)."""
    head, _, _ = stream_id.partition("-")
    return head


def new(event: Event, **metadata: Any) -> NewEvent:
    """Wraps a payload for appending, with optional metadata fields."""
    return NewEvent(event=event, metadata=Metadata(**metadata))
