"""An ephemeral agent's reservation (:mod:`services.agent.reservation`): when a reserved agent
stops by itself, decided over the agent's view of its one allocation; no API, no processes."""

from __future__ import annotations

from services.agent.reservation import reservation_verdict
from services.agent.state import Allocation


def ended(state: str = "exited", *, retry: bool = False) -> Allocation:
    """The reserved allocation after its lifecycle finished here."""
    alloc = Allocation("7.1", state=state, retry=retry)
    alloc.finished.set()
    return alloc


def test_a_reserved_agent_stops_when_its_allocation_has_not_started_within_the_wait() -> None:
    """No start within ``reserved_wait`` seconds: stop; before that, or once seen, keep going."""
    assert reservation_verdict(None, seen=False, exit_pending=False, waited=10.0, reserved_wait=10)
    assert (
        reservation_verdict(None, seen=False, exit_pending=False, waited=5.0, reserved_wait=10)
        is None
    )
    assert (
        reservation_verdict(None, seen=True, exit_pending=False, waited=99.0, reserved_wait=10)
        is None
    )


def test_a_reserved_agent_stops_only_once_its_run_ended_and_the_exit_was_reported() -> None:
    """A running run, an exit still in the outbox, or a start to retry keep it; an ended and
    reported run (or one never started because it ended first) stops it."""
    running = Allocation("7.1", state="running")
    verdict = reservation_verdict
    assert verdict(running, seen=True, exit_pending=False, waited=1e6, reserved_wait=1) is None
    assert verdict(ended(), seen=True, exit_pending=True, waited=1.0, reserved_wait=1) is None
    retried = ended("starting", retry=True)
    assert verdict(retried, seen=True, exit_pending=False, waited=1.0, reserved_wait=1) is None
    assert verdict(ended(), seen=True, exit_pending=False, waited=1.0, reserved_wait=1) == (
        "the reserved allocation ended and its exit was reported"
    )
    assert verdict(ended("skipped"), seen=True, exit_pending=False, waited=1.0, reserved_wait=1)
