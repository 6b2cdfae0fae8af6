"""Facts about the control plane itself (stream ``lease-<name>``)."""

from __future__ import annotations

from events.log.envelope import Event
from events.log.registry import register


@register
class LeaderElected(Event):
    """A process took a leader lease; the stream version of this event is its fencing epoch."""

    event_type = "LeaderElected"

    lease: str
    holder: str
