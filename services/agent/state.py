"""What every part of the agent shares: its settings, its API client, its runs
(:class:`Allocation`) and the steps one part takes of another.

:class:`services.agent.agent.Agent` is made of parts (:mod:`services.agent.commands`,
:mod:`services.agent.runs`, :mod:`services.agent.exits`), each a class over
:class:`AgentState`, which declares the state they share and the steps of one part the
others take, so that each part reads and type-checks alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from events.log.bus import Bus
from services.agent.client import ApiClient
from services.agent.config import AgentConfig
from services.agent.confinement import Confinement
from services.agent.credential import Credential
from services.agent.docker_runtime import TrialContainers
from services.agent.leftovers import RunProcesses
from services.agent.outbox import ExitReport, UnreportedExits
from services.agent.processes import TrialProcesses
from services.agent.runtime import CodeCache
from services.agent.slots import Slot

if TYPE_CHECKING:
    from services.agent.commands import CommandLog


@dataclass
class Allocation:
    """One run on this agent and how far it got."""

    allocation_id: str
    state: str = "starting"  # starting | running | exited | skipped
    procs: TrialProcesses | TrialContainers | None = None
    preempt_requested: bool = False
    kill_requested: bool = False
    stop_reason: str = ""
    agent_shutdown: bool = False
    """The agent stopped the run because the agent itself is shutting down."""
    preempt_timeout: float | None = None
    retry: bool = False
    listed_from: int = 0
    """The first heartbeat number that lists this allocation."""
    launched: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    signals: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def active(self) -> bool:
        """True until the run has exited (or was skipped)."""
        return self.state in ("starting", "running")


class AgentState:
    """The state the parts of an agent share, and the steps one part takes of another.

    The attributes are set by :class:`services.agent.agent.Agent`; the steps are implemented by
    the part named in each one's docstring.
    """

    config: AgentConfig
    id: str
    slots: list[Slot]
    gpu_slots: dict[str, str]
    incarnation: str
    confinement: Confinement
    client: ApiClient
    code: CodeCache
    executed: CommandLog
    unreported: UnreportedExits
    run_processes: RunProcesses
    allocations: dict[str, Allocation]
    credential: Credential | None
    _inflight: set[str]
    _tasks: set[asyncio.Task[Any]]
    _registrations: int
    _registered: bool
    _heartbeats: int
    _bus: Bus | None
    _sub: Any
    _docker: Any

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _lifecycle(self, alloc: Allocation) -> None:
        """Runs ``alloc`` to its end (:class:`services.agent.runs.RunLaunching`)."""
        raise NotImplementedError

    def _preempt(self, allocation_id: str) -> bool:
        """Asks a run to checkpoint and stop (:class:`services.agent.commands.CommandHandling`)."""
        raise NotImplementedError

    def _kill(self, alloc: Allocation, reason: str) -> None:
        """Stops a run (:class:`services.agent.commands.CommandHandling`)."""
        raise NotImplementedError

    async def _report_exit(
        self, allocation_id: str, exit_code: int, message: str, *, agent_shutdown: bool = False
    ) -> None:
        """Keeps and sends an exit report (:class:`services.agent.exits.ExitReporting`)."""
        raise NotImplementedError

    async def _keep_exit(
        self, allocation_id: str, exit_code: int, message: str, *, agent_shutdown: bool = False
    ) -> ExitReport:
        """Keeps an exit report on disk (:class:`services.agent.exits.ExitReporting`)."""
        raise NotImplementedError

    async def _send_exit(self, report: ExitReport) -> None:
        """Sends a kept exit report (:class:`services.agent.exits.ExitReporting`)."""
        raise NotImplementedError
