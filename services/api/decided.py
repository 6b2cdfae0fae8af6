"""The one way a route appends: the events a decider (:mod:`events.domain.deciders`) returned.

A route parses the request, authorizes the caller, folds the state it decides over (in the
transaction it will append in), calls the pure decider and then either raises the HTTP error
of its :class:`~events.domain.deciders.Refusal` (:func:`accepted`) or appends its events with
:func:`append_decided`, at the stream version it folded: a concurrent append makes the
transaction fail with ``ConcurrencyError`` and :func:`services.api.inbox.in_transaction`
re-folds and decides again. ``routes_*`` modules call ``tx.append`` nowhere else (a source scan
in ``tests/unit/test_deciders_in_routes.py`` holds them to it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from events.domain.deciders import Caused, Refusal
from events.log.envelope import Event, RecordedEvent, new
from events.log.store import Transaction
from services.api.errors import ApiError

T = TypeVar("T")
E = TypeVar("E", bound=Event | Caused)

_STATUS = {"not_found": 404, "conflict": 409, "invalid": 400}


def refusal_error(refusal: Refusal) -> ApiError:
    """The HTTP error of a refusal: 404 not found, 409 conflict, 400 invalid, with its path
    and its ``code`` as the error's ``reason``."""
    details = {"reason": refusal.code} if refusal.code is not None else None
    return ApiError(_STATUS[refusal.reason], refusal.message, path=refusal.field, details=details)


def accepted(decision: T | Refusal) -> T:
    """What the decider decided, or its refusal raised as the HTTP error.

    Raises:
        ApiError: the decider refused (:func:`refusal_error`); final, nothing was appended.
    """
    if isinstance(decision, Refusal):
        raise refusal_error(decision)
    return decision


async def append_decided(
    tx: Transaction,
    stream_id: str,
    events: Sequence[Event | Caused],
    *,
    expected_version: int | None,
    actor: str | None = None,
    causation_id: str | None = None,
) -> list[RecordedEvent]:
    """Appends a decider's ``events`` (none: nothing) to ``stream_id`` in ``tx``.

    Args:
        tx: the transaction the state was folded in.
        stream_id: the aggregate's stream.
        events: what the decider returned, in order.
        expected_version: the folded stream's version (0: a new stream; ``None``: any, for a
            stream whose order the decision does not depend on).
        actor: who acted, recorded in each event's metadata.
        causation_id: the request's idempotency key, when it has one (a :class:`Caused`
            event carries its own: its batch item's key).

    Raises:
        ConcurrencyError: the stream moved on since it was folded (retryable: re-fold).
    """
    if not events:
        return []
    meta = {
        key: value
        for key, value in (("actor", actor), ("causation_id", causation_id))
        if value is not None
    }
    stamped = [
        new(item.event, **(meta | {"causation_id": item.causation_id}))
        if isinstance(item, Caused)
        else new(item, **meta)
        for item in events
    ]
    return await tx.append(stream_id, stamped, expected_version=expected_version)


async def append_accepted(
    tx: Transaction,
    stream_id: str,
    decision: list[E] | Refusal,
    *,
    expected_version: int | None,
    actor: str | None = None,
    causation_id: str | None = None,
) -> list[E]:
    """:func:`accepted`, then :func:`append_decided`: the decider's events appended to
    ``stream_id`` at the folded ``expected_version`` (see :func:`append_decided` for the
    arguments).

    Returns:
        The events decided (none: nothing was appended).

    Raises:
        ApiError: the decider refused; nothing was appended.
        ConcurrencyError: the stream moved on since it was folded (retryable: re-fold).
    """
    events = accepted(decision)
    await append_decided(
        tx,
        stream_id,
        events,
        expected_version=expected_version,
        actor=actor,
        causation_id=causation_id,
    )
    return events
