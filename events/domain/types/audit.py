"""Facts about API requests that left no other trace in the log (stream ``audit-api``).

A request that changes state through events is audited by those events' metadata (actor,
request id, remote address). These two types cover the rest: a request the gateway refused,
and a mutating request that succeeded without appending (accounts, passwords, tokens). Neither
ever holds a request body, a token or a password.
"""

from __future__ import annotations

from events.log.envelope import Event
from events.log.registry import register

AUDIT_STREAM = "audit-api"
"""The stream both types are appended to."""


@register
class RequestRejected(Event):
    """The gateway refused a request (401, 403, a bad body or config, an illegal state change).

    ``suppressed`` counts the same caller's rejections that were not recorded one by one since
    its previous recorded one (see ``services.api.audit_trail`` for the rule);
    ``experiment_id`` is the experiment the route names, if it names one.
    """

    event_type = "RequestRejected"

    method: str
    route: str
    path: str
    status: int
    message: str
    suppressed: int = 0
    experiment_id: int | None = None


@register
class RequestAccepted(Event):
    """A mutating request succeeded without appending an event (e.g. a user was created)."""

    event_type = "RequestAccepted"

    method: str
    route: str
    path: str
    status: int
    experiment_id: int | None = None
