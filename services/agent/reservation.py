"""An ephemeral agent's reservation (``--reserved-for``): the one allocation a resource manager's
job (Slurm's) started this agent for, after which the agent has nothing left to do.

Invariant: a reserved agent stops itself (sets its stop event: the ordinary clean shutdown, exit
status 0) only when

- its allocation has ended here (the run exited, or was never started because it was no longer
  active) and its exit report is no longer in the outbox of unreported exits (the API took it,
  or refused it for good), so the log says how the run ended before the job's nodes go; or
- its allocation's start did not reach this agent within ``reserved_wait`` seconds of the
  registration, so a job the scheduler never used does not hold its nodes forever.

A start that is to be retried (the spec was unavailable) has not ended the allocation.
:func:`reservation_verdict` decides; :func:`hold_reservation` watches the agent and acts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Protocol

import structlog

from services.agent.config import AgentConfig
from services.agent.outbox import UnreportedExits
from services.agent.state import Allocation

log = structlog.get_logger("agent")

POLL_SECONDS = 0.5
"""How often the watch looks at the agent's allocations and outbox."""


class ReservedAgent(Protocol):
    """What the watch reads of the agent."""

    config: AgentConfig
    allocations: dict[str, Allocation]
    unreported: UnreportedExits


def reservation_verdict(
    alloc: Allocation | None,
    *,
    seen: bool,
    exit_pending: bool,
    waited: float,
    reserved_wait: float,
) -> str | None:
    """Why the reserved agent is to stop now, or ``None`` while it is to keep going.

    Args:
        alloc: the reserved allocation as the agent knows it (``None``: no start for it here).
        seen: whether its start has reached this agent since the registration.
        exit_pending: whether its exit report is still in the outbox.
        waited: seconds since the registration.
        reserved_wait: how long to wait for the start (``AgentConfig.reserved_wait``).

    Example:
        >>> reservation_verdict(None, seen=False, exit_pending=False, waited=601.0,
        ...                     reserved_wait=600.0)
        'the reserved allocation was not started here within 600 seconds'
    """
    if alloc is None:
        if not seen and waited >= reserved_wait:
            return f"the reserved allocation was not started here within {reserved_wait:g} seconds"
        return None
    if alloc.active or alloc.retry or not alloc.finished.is_set() or exit_pending:
        return None
    if alloc.state == "skipped":
        return "the reserved allocation ended before it started here"
    return "the reserved allocation ended and its exit was reported"


async def hold_reservation(agent: ReservedAgent, stop: asyncio.Event) -> None:
    """Watches the reserved allocation of a registered agent until
    :func:`reservation_verdict` says to stop, then logs why and sets ``stop``; returns at once
    when the agent has no reservation, or once ``stop`` is set by anything else."""
    allocation_id = agent.config.reserved_for
    if allocation_id is None:
        return
    registered = time.monotonic()
    seen = False
    while not stop.is_set():
        alloc = agent.allocations.get(allocation_id)
        seen = seen or alloc is not None
        exit_pending = False
        if alloc is not None and alloc.finished.is_set():
            pending = await asyncio.to_thread(agent.unreported.pending)
            exit_pending = any(r.allocation_id == allocation_id for r in pending)
        reason = reservation_verdict(
            alloc,
            seen=seen,
            exit_pending=exit_pending,
            waited=time.monotonic() - registered,
            reserved_wait=agent.config.reserved_wait,
        )
        if reason is not None:
            log.info("reserved agent stopping", allocation_id=allocation_id, reason=reason)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_SECONDS)
