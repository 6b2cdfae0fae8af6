"""The agent's deciders: an agent process registers and says it is leaving; a user (admin)
enables and disables its slots.

Each ``decide_*`` is pure over the agent's folded stream
(:class:`~events.domain.aggregates.AgentView`) and a command, and returns the events to append
to the agent's stream (``[]``: a repeat) or a :class:`~events.domain.deciders.Refusal`.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.domain.aggregates import AgentView
from events.domain.deciders import Decision, not_found
from events.domain.types import AgentLeaving, AgentRegistered, SlotsDisabled, SlotsEnabled
from events.domain.types.agent import Slot


@dataclass(frozen=True)
class RegisterAgent:
    """Agent process ``incarnation`` on ``hostname`` offers ``slots`` to ``resource_pool``
    (only to allocation ``reserved_for`` when it names one: an ephemeral agent)."""

    agent_id: str
    resource_pool: str
    slots: tuple[Slot, ...]
    hostname: str = ""
    incarnation: str = ""
    reserved_for: str | None = None


def decide_register(view: AgentView, command: RegisterAgent) -> Decision:
    """``AgentRegistered``; ``[]`` when this process is registered already with exactly these
    slots and reservation (a restarted agent comes with a new incarnation, so it always
    registers anew)."""
    event = AgentRegistered(
        agent_id=command.agent_id,
        resource_pool=command.resource_pool,
        slots=list(command.slots),
        hostname=command.hostname,
        incarnation=command.incarnation,
        reserved_for=command.reserved_for,
    )
    if view.registered and view.registration == event:
        return []
    return [event]


@dataclass(frozen=True)
class LeaveAgent:
    """Agent process ``incarnation`` is shutting down: place nothing more on it."""

    agent_id: str
    incarnation: str


def decide_leaving(view: AgentView, command: LeaveAgent) -> Decision:
    """``AgentLeaving``; ``[]`` when it said so already or is not the registered process."""
    registration = view.registration
    if view.leaving or registration is None or registration.incarnation != command.incarnation:
        return []
    return [AgentLeaving(agent_id=command.agent_id, incarnation=command.incarnation)]


@dataclass(frozen=True)
class SetSlotsEnabled:
    """Enable or disable the agent's slot ``slot_id`` (``None``: the whole agent); a disable
    with ``drain`` lets what runs there finish."""

    agent_id: str
    enable: bool
    actor: str
    slot_id: str | None = None
    drain: bool = False


def decide_slots_enabled(view: AgentView, command: SetSlotsEnabled) -> Decision:
    """``SlotsEnabled`` or ``SlotsDisabled`` (recorded every time: the last one stands).

    Refused (not found) for an agent never registered, or a slot it does not have.
    """
    agent_id = command.agent_id
    if view.registration is None:
        return not_found(f"no agent {agent_id}")
    if command.slot_id is not None and command.slot_id not in view.slot_ids:
        return not_found(f"agent {agent_id} has no slot {command.slot_id!r}")
    slot_ids = [command.slot_id] if command.slot_id is not None else []
    if command.enable:
        return [SlotsEnabled(agent_id=agent_id, slot_ids=slot_ids, actor=command.actor)]
    return [
        SlotsDisabled(
            agent_id=agent_id, slot_ids=slot_ids, drain=command.drain, actor=command.actor
        )
    ]
