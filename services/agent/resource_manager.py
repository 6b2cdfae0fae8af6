"""What the agent does when the resource manager that started it (Slurm) signals its job
(``--preempt-on-term``).

Slurm's ``scancel`` and time limit send SIGTERM to every process of the job's steps, then
SIGKILL after its ``KillWait``; ``--signal=USR2@N`` warns N seconds before the time limit. An
agent's own shutdown would stop its runs at once and report them lost, so instead:

- a first SIGTERM asks the API to preempt each trial run active here
  (``POST /allocations/{id}/signals/pending_preemption``), waits until those runs have ended
  here (they checkpoint and exit through the ordinary preemption: the scheduler's ``preempt``
  command and the trial's long poll, so they end ``preempted`` and are requeued), then sets the
  stop event (the clean shutdown). With no trial run active, or when the API cannot take a
  request, it sets the stop event at once: today's shutdown.
- a second SIGTERM sets the stop event at once.
- SIGUSR2 asks the same preemptions and never stops the agent.

A task's run (a notebook, a command) is never preempted: the shutdown stops it as usual.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import structlog

from events import settings
from events.domain.names import task_of_allocation
from services.agent.client import ApiClient, ApiError
from services.agent.state import Allocation

log = structlog.get_logger("agent")

PREEMPT_SIGNALS_VARIABLE = settings.PREEMPT_SIGNALS.name
"""The variable that tells a run's processes which signals mean "checkpoint and exit" (read by
:mod:`cairn.core`): a resource manager that stops a job signals every process of it, the
trial's too, not only the agent."""
PREEMPT_SIGNALS = "TERM,USR2"
"""Slurm's: SIGTERM when a job is cancelled or reaches its time limit, SIGUSR2 as the warning
``--signal=USR2@N`` asks for."""

REQUEST_RETRY_SECONDS = 10.0
"""How long one preemption request is retried while the API is unreachable (Slurm's default
``KillWait`` is 30 s)."""


class SignalledAgent(Protocol):
    """What the handler reads of the agent."""

    id: str
    incarnation: str
    client: ApiClient
    allocations: dict[str, Allocation]


class ResourceManagerSignals:
    """The handlers of SIGTERM and SIGUSR2 for an agent run under a resource manager.

    Args:
        agent: the agent whose trial runs are given back.
        stop: the agent's stop event (set: the clean shutdown).
    """

    def __init__(self, agent: SignalledAgent, stop: asyncio.Event) -> None:
        self._agent = agent
        self._stop = stop
        self._terminating = False
        self._requests: set[asyncio.Task[Any]] = set()

    def terminate(self) -> None:
        """SIGTERM: the first gives the trial runs back, then stops; a second stops at once."""
        if self._terminating:
            log.info("second SIGTERM: shutting down now")
            self._stop.set()
            return
        self._terminating = True
        self._start(self._give_back("SIGTERM", then_stop=True))

    def warn(self) -> None:
        """SIGUSR2: gives the trial runs back; the agent keeps running."""
        self._start(self._give_back("SIGUSR2", then_stop=False))

    def _start(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    async def _give_back(self, signal_name: str, *, then_stop: bool) -> None:
        agent = self._agent
        trials = [
            alloc
            for alloc in agent.allocations.values()
            if alloc.active and task_of_allocation(alloc.allocation_id) is None
        ]
        if not trials:
            log.info("signalled with no trial run to preempt", signal=signal_name)
            if then_stop:
                self._stop.set()
            return
        for alloc in trials:
            aid = alloc.allocation_id
            try:
                await agent.client.pending_preemption(
                    aid,
                    agent.id,
                    signal_name,
                    f"pending_preemption:{aid}:{agent.id}:{agent.incarnation}:{signal_name}",
                    retry_for=REQUEST_RETRY_SECONDS,
                )
            except ApiError as exc:
                log.warning("preemption request failed", allocation_id=aid, error=str(exc))
                if then_stop:
                    self._stop.set()  # the runs are stopped by the shutdown instead
                    return
            else:
                log.info("preemption requested", allocation_id=aid, signal=signal_name)
        if not then_stop:
            return
        await asyncio.wait({asyncio.ensure_future(a.finished.wait()) for a in trials})
        log.info("trial runs given back; shutting down", signal=signal_name)
        self._stop.set()
