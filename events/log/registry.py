"""Decoding stored events: (type, schema_version) -> upcaster chain -> current pydantic model.

Upcasters are pure ``dict -> dict`` functions registered per (type, from_version); decoding a
payload stored at version v runs the chain v -> v+1 -> ... -> current before validation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from events.log.envelope import Event
from events.log.errors import UnknownEventError

Payload = dict[str, Any]
Upcaster = Callable[[Payload], Payload]
E = TypeVar("E", bound=type[Event])

_models: dict[str, type[Event]] = {}
_current: dict[str, int] = {}  # event type -> its current schema version (replay's hot path)
_upcasters: dict[tuple[str, int], Upcaster] = {}


def register(model: E) -> E:
    """Class decorator: makes ``model`` the current version of its ``event_type``."""
    name = model.event_type
    if name in _models and _models[name] is not model:
        raise ValueError(f"event type {name!r} registered twice")
    _models[name] = model
    _current[name] = model.schema_version
    return model


def upcaster(event_type: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Decorator: registers a pure function turning a ``from_version`` payload into the next."""

    def wrap(fn: Upcaster) -> Upcaster:
        _upcasters[(event_type, from_version)] = fn
        return fn

    return wrap


def model_for(event_type: str) -> type[Event]:
    """Returns the current model of ``event_type``."""
    _ensure_loaded()
    try:
        return _models[event_type]
    except KeyError:
        raise UnknownEventError(f"unknown event type {event_type!r}") from None


def known_types() -> dict[str, type[Event]]:
    """Returns every registered event type and its current model."""
    _ensure_loaded()
    return dict(_models)


def upcast(event_type: str, schema_version: int, payload: Payload) -> Payload:
    """Runs the upcaster chain from ``schema_version`` to the current version of ``event_type``."""
    current = model_for(event_type).schema_version
    if schema_version > current:
        raise UnknownEventError(
            f"{event_type} v{schema_version} is newer than this code (v{current}); upgrade cairn"
        )
    data = dict(payload)
    for version in range(schema_version, current):
        step = _upcasters.get((event_type, version))
        if step is None:
            raise UnknownEventError(f"no upcaster for {event_type} v{version} -> v{version + 1}")
        data = step(data)
    return data


def to_current(event_type: str, schema_version: int, payload: Payload) -> tuple[int, Payload]:
    """The payload upcast to its type's current version, and that version (the read boundary).

    A payload that cannot be upcast here (an unknown type, a newer version, a failing
    upcaster) comes back unchanged with its own version; :func:`decode` reports why.
    """
    if _current.get(event_type) == schema_version:
        return schema_version, payload
    model = model_for_or_none(event_type)
    if model is None or schema_version >= model.schema_version:
        return schema_version, payload
    try:
        return model.schema_version, upcast(event_type, schema_version, payload)
    except UnknownEventError:
        return schema_version, payload


def model_for_or_none(event_type: str) -> type[Event] | None:
    """The current model of ``event_type``, or ``None`` for a type nobody registered."""
    _ensure_loaded()
    return _models.get(event_type)


def decode(event_type: str, schema_version: int, payload: Payload) -> Event:
    """Upcasts and validates a stored payload into the current model of its type."""
    model = _models.get(event_type) or model_for(event_type)
    data = (
        payload
        if schema_version == model.schema_version
        else upcast(event_type, schema_version, payload)
    )
    try:
        return model.__pydantic_validator__.validate_python(data)  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise UnknownEventError(f"{event_type} v{schema_version}: invalid payload: {exc}") from exc


def encode(event: Event) -> Payload:
    """Returns the JSON-able payload of an event at its current schema version."""
    return event.model_dump(mode="json")


def _ensure_loaded() -> None:
    if not _models:
        import events.domain.types  # noqa: F401  (registers every model)
