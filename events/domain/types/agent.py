"""Facts on an agent's stream (``agent-<id>``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from events.log.envelope import Event
from events.log.registry import register, upcaster


class Slot(BaseModel):
    """One schedulable device of an agent."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    slot_id: str
    device: Literal["cpu", "cuda"] = "cpu"
    name: str = ""


@register
class AgentRegistered(Event):
    """An agent process announced itself with its slots and resource pool.

    ``incarnation`` is fresh for every start of the agent process (v1 had none; upcast to ``""``),
    so a restarted agent registers anew even with the same slots, and whatever the scheduler
    placed on it before that registration is known to be gone.

    ``reserved_for`` (v3; upcast to ``None``) names the allocation an ephemeral agent was
    started for (a Slurm job's agent, say): the scheduler places nothing else on it.
    """

    event_type = "AgentRegistered"
    schema_version = 3

    agent_id: str
    resource_pool: str = "default"
    slots: list[Slot]
    hostname: str = ""
    incarnation: str = ""
    reserved_for: str | None = None
    """The allocation this ephemeral agent was started for; the scheduler places nothing else
    on it."""


@upcaster("AgentRegistered", 1)
def _agent_registered_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "incarnation": ""}


@upcaster("AgentRegistered", 2)
def _agent_registered_v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "reserved_for": None}


@register
class AgentLeaving(Event):
    """The agent process ``incarnation`` is shutting down: it takes no new work from now on.

    Recorded before the agent stops its runs and reports their exits, so the scheduler, which
    restarts those runs, places none of them (nor anything else) on this agent until it
    registers anew. A later registration (a new incarnation) ends it.
    """

    event_type = "AgentLeaving"

    agent_id: str
    incarnation: str = ""


@register
class AgentLost(Event):
    """An agent stopped heartbeating; its running trials are to be treated as lost."""

    event_type = "AgentLost"

    agent_id: str
    reason: str = "heartbeat timeout"


@register
class SlotsDisabled(Event):
    """A user took slots out of scheduling (``slot_ids`` empty: every slot of the agent).

    Runs on those slots are preempted (they checkpoint and are requeued elsewhere) unless
    ``drain`` is set, in which case they run to their end and only new work is kept away.
    """

    event_type = "SlotsDisabled"

    agent_id: str
    slot_ids: list[str] = Field(default_factory=list)
    drain: bool = False
    actor: str = ""


@register
class SlotsEnabled(Event):
    """A user put slots back into scheduling (``slot_ids`` empty: every slot of the agent)."""

    event_type = "SlotsEnabled"

    agent_id: str
    slot_ids: list[str] = Field(default_factory=list)
    actor: str = ""
