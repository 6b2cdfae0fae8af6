"""The agent's deciders (:mod:`events.domain.deciders.agent`): register, leaving, enabling and
disabling slots, over the folded agent stream; no HTTP, no database."""

from __future__ import annotations

from events.domain.aggregates import AgentView
from events.domain.deciders import Refusal
from events.domain.deciders.agent import (
    LeaveAgent,
    RegisterAgent,
    SetSlotsEnabled,
    decide_leaving,
    decide_register,
    decide_slots_enabled,
)
from events.domain.types import AgentLeaving, AgentRegistered, SlotsDisabled, SlotsEnabled
from events.domain.types.agent import Slot

REGISTER = RegisterAgent(
    agent_id="gpu03", resource_pool="default", slots=(Slot(slot_id="0"),), incarnation="p1"
)


def registered(**fields: object) -> AgentView:
    """Agent gpu03 as registered by ``REGISTER``."""
    [event] = decide_register(AgentView("gpu03"), REGISTER)  # type: ignore[misc]
    assert isinstance(event, AgentRegistered)
    return AgentView("gpu03", version=1, registration=event, **fields)  # type: ignore[arg-type]


def test_register_records_a_new_process_and_ignores_a_repeat() -> None:
    """A first registration is recorded; the same process with the same slots, nothing; new
    slots are recorded again."""
    assert decide_register(AgentView("gpu03"), REGISTER) == [
        AgentRegistered(
            agent_id="gpu03", resource_pool="default", slots=[Slot(slot_id="0")], incarnation="p1"
        )
    ]
    assert decide_register(registered(), REGISTER) == []
    more = RegisterAgent("gpu03", "default", (Slot(slot_id="0"), Slot(slot_id="1")), "", "p1")
    assert len(decide_register(registered(), more)) == 1  # type: ignore[arg-type]


def test_a_reserved_registration_is_recorded_with_its_allocation_and_repeats_idempotently() -> None:
    """An ephemeral agent's registration carries the allocation it was started for into the
    fold; the same body again appends nothing."""
    reserved = RegisterAgent("gpu03", "slurm", (Slot(slot_id="0"),), "n1", "p1", "7.3.0")
    [event] = decide_register(AgentView("gpu03"), reserved)  # type: ignore[misc]
    assert isinstance(event, AgentRegistered)
    assert event.reserved_for == "7.3.0"
    view = AgentView("gpu03", version=1, registration=event)
    assert view.reserved_for == "7.3.0"
    assert decide_register(view, reserved) == []
    assert registered().reserved_for is None


def test_leaving_is_recorded_once_for_the_registered_process_only() -> None:
    """The registered process leaving is recorded; again, or from another process, nothing."""
    assert decide_leaving(registered(), LeaveAgent("gpu03", "p1")) == [
        AgentLeaving(agent_id="gpu03", incarnation="p1")
    ]
    assert decide_leaving(registered(leaving=True), LeaveAgent("gpu03", "p1")) == []
    assert decide_leaving(registered(), LeaveAgent("gpu03", "p0")) == []
    assert decide_leaving(AgentView("gpu03"), LeaveAgent("gpu03", "p1")) == []


def test_slots_are_disabled_with_drain_and_enabled_by_id() -> None:
    """Disabling slot 0 with drain and enabling the whole agent are recorded as asked."""
    disable = SetSlotsEnabled("gpu03", enable=False, actor="root", slot_id="0", drain=True)
    assert decide_slots_enabled(registered(), disable) == [
        SlotsDisabled(agent_id="gpu03", slot_ids=["0"], drain=True, actor="root")
    ]
    enable = SetSlotsEnabled("gpu03", enable=True, actor="root")
    assert decide_slots_enabled(registered(), enable) == [
        SlotsEnabled(agent_id="gpu03", slot_ids=[], actor="root")
    ]


def test_slots_of_an_unknown_agent_or_slot_are_not_found() -> None:
    """An agent never registered, or a slot it does not have, is refused as not found."""
    command = SetSlotsEnabled("gpu03", enable=True, actor="root", slot_id="7")
    assert decide_slots_enabled(AgentView("gpu03"), command) == Refusal(
        "not_found", "no agent gpu03"
    )
    assert decide_slots_enabled(registered(), command) == Refusal(
        "not_found", "agent gpu03 has no slot '7'"
    )
