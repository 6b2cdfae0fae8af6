"""The agent: registers its slots, heartbeats, and executes commands from its NATS queue.

Commands arrive on ``cairn.cmd.agent.<id>`` (stream ``CAIRN_COMMANDS``) through the durable pull
consumer ``agent-<id>``. Each command id is executed at most once (ids already executed are
remembered in ``<work_dir>/executed-commands``, so a restarted agent does not repeat them); a
message is acked once its effect has started (process launched, signal sent). An allocation is
started at most once however many ``start`` commands name it.

Each start of the agent process is a new *incarnation* (a fresh id, sent with its registration,
heartbeats and started reports), so the scheduler can tell a restarted agent, which runs none of
what it was given before, from one that carries on. Heartbeats are numbered within the
incarnation and list every allocation the agent knows of until its exit has been reported; an
exit report the API cannot take yet is kept on disk (:mod:`services.agent.outbox`) and sent again,
by a later incarnation if need be.

Trial processes lead their own sessions, so they outlive an agent that is SIGKILLed. Each run's
process groups are recorded on disk (:mod:`services.agent.leftovers`) until its exit is reported,
and a new agent process SIGKILLs what is left of them before anything else, so a restarted run
never trains beside its predecessor. Tasks are no exception: a new agent process never re-attaches
a command or a notebook an earlier one started (a notebook's kernels exit with their server); its
registration ends them ``lost`` and the proxy answers 410 for them (docs/tasks.md, "Faults and
restarts"). When the agent itself shuts down (SIGTERM, ``cairn down``)
it first records that it is leaving (``AgentLeaving``: the scheduler places nothing more on it
until it registers anew), then stops its runs and says so in their exit reports
(``agent_shutdown``): the platform stopped them, so their ends do not count as the trials'
failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import nats.errors
import structlog

from events import settings
from events.domain.commands import agent_subject
from events.log.bus import COMMANDS_STREAM, Bus
from events.log.bus_auth import agent_durable
from events.log.errors import BusUnavailableError
from services.agent.client import ApiClient, ApiError
from services.agent.commands import CommandHandling, CommandLog
from services.agent.config import AgentConfig
from services.agent.confinement import Confinement
from services.agent.credential import Credential, CredentialError, obtain
from services.agent.docker_runtime import remove_leftover_containers
from services.agent.exits import ExitReporting
from services.agent.leftovers import RunProcesses, kill_leftovers
from services.agent.outbox import UnreportedExits
from services.agent.reservation import hold_reservation
from services.agent.runs import RunLaunching
from services.agent.runtime import CodeCache
from services.agent.slots import Slot, discover_slots
from services.agent.state import Allocation

log = structlog.get_logger("agent")

T = TypeVar("T")


class Agent(CommandHandling, RunLaunching, ExitReporting):
    """One agent process.

    Args:
        config: the settings.
        slots: the slots to offer (discovered when omitted).
    """

    def __init__(self, config: AgentConfig, slots: list[Slot] | None = None) -> None:
        self.config = config
        self.id = config.agent_id
        self.slots = (
            slots if slots is not None else discover_slots(config.agent_id, config.artificial_slots)
        )
        self.gpu_slots = {s.slot_id: s.slot_id for s in self.slots if s.device == "cuda"}
        self.incarnation = uuid.uuid4().hex
        config.work_dir.mkdir(parents=True, exist_ok=True)
        self.confinement = Confinement(
            config.work_dir,
            hide=config.hide,
            default_checkpoints=config.checkpoint_root or config.work_dir / "checkpoints",
        )
        self.client = ApiClient(config.api_url, config.token)
        self.code = CodeCache(self.client, config.work_dir / "code")
        self.executed = CommandLog(config.work_dir / "executed-commands")
        self.unreported = UnreportedExits(config.work_dir / "unreported-exits")
        self.run_processes = RunProcesses(config.work_dir / "run-processes")
        self.allocations: dict[str, Allocation] = {}
        self._inflight: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._registrations = 0
        self._registered = False
        self._heartbeats = 0
        self.last_heartbeat: float | None = None
        """When (``time.monotonic()``) the gateway last took a heartbeat of this process."""
        self._bus: Bus | None = None
        self._sub: Any = None
        self.credential: Credential | None = None
        self._docker: Any = None
        self.confinement.secure_work_dir()

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Connects, registers, serves commands until ``stop`` is set, then shuts down cleanly."""
        log.info("agent starting", agent_id=self.id, slots=[s.to_json() for s in self.slots])
        try:
            await self._stop_leftovers()
            self.credential = await obtain(
                self.client,
                self.config.work_dir,
                self.id,
                join_token_file=self.config.join_token_file,
                fallback_token=self.config.token,
            )
            self.client.token = self.credential.token
            bus = await self._connect_bus(stop)
            if bus is None:
                return
            self._bus = bus
            sub = await self._subscribe(bus, stop)
            if sub is None:
                return
            self._sub = sub
            if not await self._until_stopped(self._announce(), stop):
                return
            self._ready()
            beats = asyncio.create_task(self._heartbeat_loop(stop), name="heartbeat")
            if self.config.reserved_for is not None:
                self._spawn(hold_reservation(self, stop))
            await self._consume(sub, stop)
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
        finally:
            await self._shutdown()

    async def _stop_leftovers(self) -> None:
        """SIGKILLs the run processes an earlier process of this agent left running (and waits
        until they are gone): their runs are lost the moment this process registers."""
        killed = await asyncio.to_thread(kill_leftovers, self.run_processes)
        if killed:
            log.warning("stopped runs left by an earlier agent process", allocations=killed)
        self._docker = await remove_leftover_containers(self.id)

    async def _until_stopped(self, coro: Any, stop: asyncio.Event) -> bool:
        task = asyncio.ensure_future(coro)
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return False
        task.result()
        return True

    async def _connect_bus(self, stop: asyncio.Event) -> Bus | None:
        credential = self.credential
        return await _retry_while_unavailable(
            lambda: Bus.connect(
                self.config.nats_url,
                name=f"cairn-agent-{self.id}",
                creds=credential.nats_creds if credential else None,
                inbox_prefix=credential.inbox_prefix if credential else None,
                # An agent's own NATS user may not manage streams; the relay makes them.
                manage_streams=credential is None or credential.nats_creds is None,
                replicas=self.config.nats_replicas,
            ),
            stop,
            unavailable="NATS unavailable; retrying",
        )

    async def _subscribe(self, bus: Bus, stop: asyncio.Event) -> Any:
        """Binds the agent's durable consumer of its command subject, waiting (while the relay
        has not made the command stream yet) until it can."""
        return await _retry_while_unavailable(
            lambda: bus.pull(
                agent_durable(self.id), [agent_subject(self.id)], stream=COMMANDS_STREAM
            ),
            stop,
            unavailable="command stream unavailable; retrying",
        )

    def _ready(self) -> None:
        path = settings.READY_FILE.get()
        if path is not None:
            path.write_text(str(os.getpid()))
        log.info("ready", pid=os.getpid(), agent_id=self.id)

    async def _announce(self) -> None:
        """Delivers the exits an earlier process of this agent could not report, then registers.

        In this order: the registration of a new incarnation tells the scheduler that every run
        placed here before is lost, and the log should say how those runs really ended first.
        """
        for report in self.unreported.pending():
            log.info("reporting an earlier exit", allocation_id=report.allocation_id)
            await self._send_exit(report)
        await self.register()

    async def register(self) -> None:
        """``POST /agents/{id}/register`` with this agent's slots (retried until it lands)."""
        self._registrations += 1
        try:
            await self._register_once()
        except ApiError as exc:
            if exc.status == 401:
                raise CredentialError(
                    f"the API refused agent {self.id}'s credential (an admin revoked it?): {exc}"
                ) from exc
            raise

    async def _register_once(self) -> None:
        await self.client.register(
            self.id,
            self.config.resource_pool,
            [s.to_json() for s in self.slots],
            self.config.hostname,
            self.incarnation,
            f"register:{self.id}:{self.incarnation}:{self._registrations}",
            reserved_for=self.config.reserved_for,
        )
        self._registered = True
        log.info(
            "registered",
            agent_id=self.id,
            slots=len(self.slots),
            incarnation=self.incarnation,
            reserved_for=self.config.reserved_for,
        )

    @property
    def registered(self) -> bool:
        """Whether this process has registered with the gateway."""
        return self._registered

    @property
    def bus_connected(self) -> bool:
        """Whether the agent's NATS connection is up."""
        return self._bus is not None and self._bus.nc.is_connected

    def running(self) -> list[str]:
        """Ids of the allocations this agent is starting or running."""
        return sorted(a.allocation_id for a in self.allocations.values() if a.active)

    async def _heartbeat_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # Numbering and listing happen together, with no await between: an allocation that
            # ``_start`` adds takes the next number, so every heartbeat from it on lists it.
            self._heartbeats += 1
            seq, running = self._heartbeats, self.running()
            try:
                answer = await self.client.heartbeat(
                    self.id,
                    running,
                    self.incarnation,
                    seq,
                    f"heartbeat:{self.id}:{self.incarnation}:{seq}",
                )
                self.last_heartbeat = time.monotonic()
                if not answer.registered:
                    log.warning("the API no longer knows this agent; registering again")
                    await self.register()
            except ApiError as exc:
                log.warning("heartbeat failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.heartbeat)

    async def _consume(self, sub: Any, stop: asyncio.Event) -> None:
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                fetch = asyncio.ensure_future(sub.fetch(batch=16, timeout=5.0))
                await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():  # stopping: unacked messages are redelivered later
                    fetch.cancel()
                    with contextlib.suppress(BaseException):
                        await fetch
                    return
                await self._dispatch(fetch, stop)
        finally:
            stopped.cancel()

    async def _dispatch(self, fetch: asyncio.Future[Any], stop: asyncio.Event) -> None:
        try:
            msgs = fetch.result()
        except (nats.errors.TimeoutError, TimeoutError):
            return
        except Exception as exc:  # connection trouble: nats-py reconnects by itself
            log.warning("command fetch failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            return
        for msg in msgs:
            self._spawn(self.handle(msg))

    async def _shutdown(self) -> None:
        """Records that this process is leaving, then stops every run (SIGTERM, SIGKILL after
        the grace), reports their exits, disconnects."""
        await self._announce_leaving()
        active = [a for a in self.allocations.values() if a.active]
        if active:
            log.info("shutting down: stopping runs", allocations=[a.allocation_id for a in active])
        for alloc in active:
            if alloc.procs is None or not alloc.procs.done:
                alloc.agent_shutdown = True
            self._kill(alloc, "stopped by the agent's shutdown")
        lifecycles = [a.task for a in active if a.task is not None]
        if lifecycles:
            _, late = await asyncio.wait(lifecycles, timeout=self.config.kill_grace + 20.0)
            for task in late:
                task.cancel()
        for task in list(self._tasks):
            task.cancel()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()  # the durable consumer stays for the next start
        if self._bus is not None:
            await self._bus.close()
        await self.client.close()
        log.info("agent stopped", agent_id=self.id)

    async def _announce_leaving(self) -> None:
        """``AgentLeaving`` before the runs are stopped: the scheduler, which restarts them when
        their exits are reported, must not place those restarts (or anything) on this process,
        which would never start them. Bounded by ``leaving_timeout``: an API that is stopping
        too is not waited for (a restart placed here then is lost when the agent registers
        anew, and restarted again)."""
        if not self._registered:
            return
        key = f"leaving:{self.id}:{self.incarnation}"
        try:
            await asyncio.wait_for(
                self.client.leaving(
                    self.id, self.incarnation, key, retry_for=self.config.leaving_timeout
                ),
                self.config.leaving_timeout + 1.0,
            )
        except (ApiError, TimeoutError) as exc:
            log.warning("could not record that the agent is leaving", error=str(exc))
        else:
            log.info("leaving recorded", agent_id=self.id, incarnation=self.incarnation)


async def _retry_while_unavailable(
    attempt: Callable[[], Awaitable[T]], stop: asyncio.Event, *, unavailable: str
) -> T | None:
    """``attempt()`` again while it raises :class:`BusUnavailableError`, until ``stop`` is set.

    Waits 0.2 s more after each failure (at most 2 s), and logs ``unavailable`` at the 1st,
    10th and every 60th failure.

    Returns:
        What ``attempt()`` returned, or ``None`` once ``stop`` is set.
    """
    failures = 0
    while not stop.is_set():
        try:
            return await attempt()
        except BusUnavailableError as exc:
            failures += 1
            if failures in (1, 10) or failures % 60 == 0:
                log.warning(unavailable, error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(0.2 * failures, 2.0))
    return None
