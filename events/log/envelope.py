"""The envelope every stored event travels in, and the base class of event payloads."""

from __future__ import annotations

import builtins
import uuid
from datetime import datetime
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field


class Event(BaseModel):
    """Base of every event payload: a frozen fact with a stable type name and schema version.

    Subclasses set ``event_type`` (never renamed once stored) and ``schema_version`` (bumped with an
    upcaster in :mod:`events.log.registry` whenever the payload shape changes).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_type: ClassVar[str]
    schema_version: ClassVar[int] = 1


_E = TypeVar("_E", bound=Event)


class Metadata(BaseModel):
    """Who caused an event and why: actor, causation and correlation ids, leader epoch, and the
    API request it came from (its id and the caller's address; see :mod:`events.log.origin`)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    actor: str | None = None
    causation_id: str | None = None
    correlation_id: str | None = None
    epoch: int | None = None
    request_id: str | None = None
    remote: str | None = None


class NewEvent(BaseModel):
    """An event about to be appended: the payload plus its id and metadata."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    event: Event
    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    metadata: Metadata = Field(default_factory=Metadata)


class RecordedEvent(BaseModel):
    """An event as stored in the log, with its global position and stream version.

    ``payload`` is the JSON as stored, upcast (by :func:`events.log.store.row_to_event`) to the
    current schema version when its type has upcasters from the stored one; :meth:`decode`
    validates it into the current model, and :meth:`decode_as` into a model the caller names.
    Consumers read an event's fields from its model, never by indexing ``payload``: the raw
    JSON is for passing an event on as it is (serializing it for a table or a stream).
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

    def decode(self) -> Event:
        """Returns the payload as the current version of its event model.

        Raises:
            UnknownEventError: the type is not registered, or the payload (upcast) does not
                validate against its model.
        """
        return _decode(self.type, self.schema_version, self.payload)

    def decode_as(self, model: builtins.type[_E]) -> _E:
        """Returns the payload as ``model``, the current model of this event's type.

        For a consumer that selected the events it reads by type: ``exit =
        recorded.decode_as(TrialExited)`` then ``exit.allocation_id``.

        Raises:
            UnknownEventError: as :meth:`decode` does.
            TypeError: this event is not of ``model``'s type (a programming error).
        """
        event = _decode(self.type, self.schema_version, self.payload)
        if not isinstance(event, model):
            raise TypeError(f"event {self.position} is a {self.type}, not a {model.event_type}")
        return event


def stream_type_of(stream_id: str) -> str:
    """Returns the category of a stream id (``trial-42`` -> ``trial``)."""
    head, _, _ = stream_id.partition("-")
    return head


def new(event: Event, **metadata: Any) -> NewEvent:
    """Wraps a payload for appending, with optional metadata fields."""
    return NewEvent(event=event, metadata=Metadata(**metadata))


_RECORDED_FIELDS = frozenset(RecordedEvent.model_fields)
_METADATA_FIELDS = frozenset(Metadata.model_fields)
_NO_METADATA: dict[str, Any] = dict.fromkeys(Metadata.model_fields)
_METADATA_COUNT = len(_NO_METADATA)
_new_metadata = Metadata.__new__
_new_recorded = RecordedEvent.__new__
# One set shared by every stored event: a frozen model's fields are never set again, and a
# copy (``model_copy``) copies the set before it adds to it.
_ALL_RECORDED_FIELDS = set(_RECORDED_FIELDS)
_set = object.__setattr__


def stored_metadata(values: dict[str, Any] | None) -> Metadata:
    """A :class:`Metadata` from the log's JSON without validation; what
    ``Metadata.model_construct(**values)`` builds (unknown keys kept as extras), at a fraction
    of its cost on a replay's hot path."""
    meta = _new_metadata(Metadata)
    given = values or {}
    fields = _NO_METADATA.copy()
    fields.update(given)
    extra: dict[str, Any] = {}
    if len(fields) != _METADATA_COUNT:  # keys beyond the fields: kept as extras
        extra = {k: v for k, v in given.items() if k not in _METADATA_FIELDS}
        fields = {k: v for k, v in fields.items() if k in _METADATA_FIELDS}
    _set(meta, "__dict__", fields)
    _set(meta, "__pydantic_fields_set__", set(given))
    _set(meta, "__pydantic_extra__", extra)
    _set(meta, "__pydantic_private__", None)
    return meta


def stored_event(values: dict[str, Any]) -> RecordedEvent:
    """A :class:`RecordedEvent` from a row of our own log without validation; what
    ``RecordedEvent.model_construct(**values)`` builds when ``values`` holds every field."""
    event = _new_recorded(RecordedEvent)
    _set(event, "__dict__", values)
    _set(event, "__pydantic_fields_set__", _ALL_RECORDED_FIELDS)
    _set(event, "__pydantic_extra__", None)
    _set(event, "__pydantic_private__", None)
    return event


def _decode(event_type: str, schema_version: int, payload: dict[str, Any]) -> Event:
    # Imported on first use: events.log.registry imports this module.
    global _decode
    from events.log.registry import decode

    _decode = decode
    return decode(event_type, schema_version, payload)
