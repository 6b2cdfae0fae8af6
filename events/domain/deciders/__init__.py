"""Deciders: each user action is a pure function ``(state, command) -> events | Refusal``.

One module per aggregate: ``experiment``, ``trial`` (with ``trial_reports``, the intake of a
run's reports), ``task`` (commands and their agents' reports), ``agent``, ``checkpoint``,
``template``, ``identity`` and ``model`` (the model registry); the runs of unmanaged
experiments are decided in :mod:`events.domain.unmanaged`.

A decider reads only the folded state and the command it is given: no I/O, no clock (a time is
a field of the command), no randomness (new ids are fields of the command). It returns the
events to append (``[]``: the action changes nothing, e.g. a repeat) or a :class:`Refusal`
saying why not, independent of HTTP; the API gateway maps a refusal to its status code and
appends the events with the stream version it folded, so a concurrent writer makes it re-fold
and decide again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from events.log.envelope import Event

RefusalReason = Literal["not_found", "conflict", "invalid"]


@dataclass(frozen=True)
class Refusal:
    """Why a command was refused.

    Attributes:
        reason: ``not_found`` (what it names does not exist), ``conflict`` (the state does not
            allow it now) or ``invalid`` (the command itself is wrong, see ``field``).
        message: what went wrong, for a person.
        field: the dotted path of the offending command field, when one is to blame.
        code: a machine-readable cause a client acts on (e.g. ``run_not_current``: the
            training process stops, nothing it reports will be accepted again).
    """

    reason: RefusalReason
    message: str
    field: str | None = None
    code: str | None = None


def not_found(message: str) -> Refusal:
    """A refusal: what the command names does not exist."""
    return Refusal("not_found", message)


def conflict(message: str, field: str | None = None, *, code: str | None = None) -> Refusal:
    """A refusal: the aggregate's state does not allow the command now (because of ``field``,
    for the cause ``code``, when given)."""
    return Refusal("conflict", message, field, code)


def invalid(message: str, field: str | None = None) -> Refusal:
    """A refusal: the command is invalid, at ``field`` when one is to blame."""
    return Refusal("invalid", message, field)


Decision: TypeAlias = list[Event] | Refusal
"""What a decider returns: the events to append (maybe none) or why it refuses."""


@dataclass(frozen=True)
class Caused:
    """An event decided for one part of a command (one item of a batch), with that part's
    idempotency key as its causation id."""

    event: Event
    causation_id: str


__all__ = [
    "Caused",
    "Decision",
    "Refusal",
    "RefusalReason",
    "conflict",
    "invalid",
    "not_found",
]
