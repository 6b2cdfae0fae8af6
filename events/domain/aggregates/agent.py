"""The agent fold: an agent's latest registration, whether it is leaving or lost, its disabled
slots."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from events.domain.types import (
    AgentLeaving,
    AgentLost,
    AgentRegistered,
    SlotsDisabled,
    SlotsEnabled,
)
from events.log.envelope import Event, RecordedEvent

AGENT_FACTS = ("AgentRegistered", "AgentLeaving", "AgentLost", "SlotsDisabled", "SlotsEnabled")
"""What :func:`apply_agent` reads."""


@dataclass(slots=True)
class AgentView:
    """An agent's stream folded: its latest registration, whether that process announced it is
    leaving or was lost since, and which of its slots users disabled (and of those, which
    drain: let their running work finish)."""

    agent_id: str
    version: int = 0
    registration: AgentRegistered | None = None
    registered_at: datetime | None = None
    registered_position: int = 0
    lost: bool = False
    lost_at: datetime | None = None
    leaving: bool = False
    disabled: dict[str, bool] = field(default_factory=dict)
    """Disabled slot id -> whether it drains; survives a new registration."""

    @property
    def registered(self) -> bool:
        """Whether the agent is registered and not lost since."""
        return self.registration is not None and not self.lost

    @property
    def slot_ids(self) -> list[str]:
        """The slot ids of the latest registration."""
        return [s.slot_id for s in self.registration.slots] if self.registration else []

    @property
    def draining(self) -> set[str]:
        """The disabled slots that let their running work finish."""
        return {slot for slot, drain in self.disabled.items() if drain}

    @property
    def pool(self) -> str:
        """The resource pool of the latest registration (``""``: none named, the default)."""
        registration = self.registration
        if registration is None or "resource_pool" not in registration.model_fields_set:
            return ""
        return registration.resource_pool

    @property
    def incarnation(self) -> str:
        """The registered process's incarnation (``""`` before any registration)."""
        return self.registration.incarnation if self.registration is not None else ""

    @property
    def reserved_for(self) -> str | None:
        """The allocation the registered (ephemeral) process was started for, if any: the
        scheduler places nothing else on it (``None``: an ordinary agent, or none registered)."""
        return self.registration.reserved_for if self.registration is not None else None

    @property
    def placeable(self) -> bool:
        """Whether new work may go to this agent: registered, not lost, and its process is not
        leaving.

        A leaving agent is still registered (it is stopping its runs and reporting their
        exits), but whatever were placed on it now would never start and would be lost when it
        registers anew, so nothing is until then.
        """
        return self.registered and not self.leaving

    def usable_slots(self) -> list[str]:
        """The slots new work may be placed on."""
        return [s for s in self.slot_ids if s not in self.disabled]

    def evicting(self, slot_ids: list[str]) -> bool:
        """Whether any of ``slot_ids`` is disabled without drain (its runs are to be preempted)."""
        return any(self.disabled.get(s) is False for s in slot_ids)


def fold_agent(agent_id: str, events: Iterable[RecordedEvent]) -> AgentView:
    """Folds an agent's stream."""
    view = AgentView(agent_id)
    for recorded in events:
        apply_agent(view, recorded)
    return view


def apply_agent(view: AgentView, recorded: RecordedEvent, event: Event | None = None) -> None:
    """Applies one agent event to ``view`` in place (``event``: ``recorded`` already decoded)."""
    view.version = max(view.version, recorded.stream_version)
    if recorded.type not in AGENT_FACTS:
        return
    if event is None:
        event = recorded.decode()
    if isinstance(event, AgentRegistered):
        view.registration = event
        view.registered_at = recorded.recorded_at
        view.registered_position = recorded.position
        view.lost = False
        view.lost_at = None
        view.leaving = False
    elif isinstance(event, AgentLeaving):
        # Only the registered process's announcement counts: an older one's, late, does not.
        registration = view.registration
        view.leaving = view.leaving or (
            registration is not None and registration.incarnation == event.incarnation
        )
    elif isinstance(event, AgentLost):
        view.lost = True
        view.lost_at = recorded.recorded_at
    elif isinstance(event, SlotsDisabled):
        for slot_id in event.slot_ids or view.slot_ids:
            view.disabled[slot_id] = event.drain
    elif isinstance(event, SlotsEnabled):
        if not event.slot_ids:
            view.disabled.clear()
        for slot_id in event.slot_ids:
            view.disabled.pop(slot_id, None)
