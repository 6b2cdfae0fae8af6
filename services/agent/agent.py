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
never trains beside its predecessor. When the agent itself shuts down (SIGTERM, ``cairn down``)
it first records that it is leaving (``AgentLeaving``: the scheduler places nothing more on it
until it registers anew), then stops its runs and says so in their exit reports
(``agent_shutdown``): the platform stopped them, so their ends do not count as the trials'
failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import tarfile
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import structlog

from events import settings
from events.domain.commands import agent_subject
from events.domain.config.cluster import TaskImages, TaskPolicy
from events.domain.config.host_requests import HostPolicy
from events.log import faults
from events.log.bus import COMMANDS_STREAM, Bus
from events.log.bus_auth import agent_durable
from events.log.errors import BusUnavailableError
from services.agent.client import ApiClient, ApiError
from services.agent.confinement import Confinement, RunDirectoryError, RunPlaces
from services.agent.credential import Credential, CredentialError, obtain
from services.agent.docker_runtime import (
    DockerRuntimeError,
    TrialContainers,
    remove_leftover_containers,
    run_image,
)
from services.agent.docker_runtime import launch as launch_containers
from services.agent.leftovers import RunProcesses, kill_leftovers, record_of
from services.agent.outbox import ExitReport, UnreportedExits
from services.agent.runtime import (
    CodeCache,
    LogShipper,
    RunSpec,
    TrialProcesses,
    free_port,
    prepare_work_dir,
    reachable_address,
    trial_environment,
)
from services.agent.signals import preempt, terminate
from services.agent.slots import Slot, discover_slots
from services.confine import ConfinementError

log = structlog.get_logger("agent")

KILLED_BEFORE_START = 137  # reported when a kill arrives before the process was launched
RENDEZVOUS_FAILED = 1  # reported when the agents of a gang did not all join in time
GANG_POLL_SECONDS = 10.0


@dataclass
class AgentConfig:
    """The agent's settings (see ``python -m services.agent --help``)."""

    agent_id: str
    api_url: str
    nats_url: str
    token: str = ""
    """A join token given by value (``CAIRN_AGENT_TOKEN``, for clusters configured that way);
    ``join_token_file`` is preferred."""
    join_token_file: Path | None = None
    """The cluster's join token, presented once on the agent's first start (see
    :mod:`services.agent.credential`)."""
    resource_pool: str = "default"
    work_dir: Path = field(default_factory=lambda: Path.cwd() / ".cairn-agent")
    checkpoint_root: Path | None = None
    artificial_slots: int | None = None
    heartbeat: float = 2.0
    preempt_timeout: float = 30.0
    kill_grace: float = 5.0
    leaving_timeout: float = 2.0
    """Seconds a shutting-down agent tries to record that it is leaving before it stops its runs
    anyway (the API may be stopping too)."""
    hostname: str = field(default_factory=socket.gethostname)
    rendezvous_timeout: float = 300.0
    """Seconds a run placed on several agents waits for all of them to join; then it fails."""
    address: str | None = None
    """Where the other agents of a gang reach this one (default: see ``reachable_address``)."""
    docker_share_from: str | None = None
    """The container the agent runs in, if any: trial containers join its network and get its
    work and checkpoint mounts."""
    hide: tuple[Path, ...] = ()
    """Paths no run's code may see besides the work directory (the cluster's data directory)."""
    host_policy: HostPolicy = field(default_factory=TaskPolicy)
    """What the cluster allows trials of this host (bind mounts, devices, capabilities): the
    cluster config's ``tasks``."""
    default_image: TaskImages | None = None
    """The image a run whose config names none runs in (``tasks.default_image``); ``None``:
    such a run is a process on this machine."""


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


class CommandLog:
    """The ids of commands already executed, kept in a file that survives agent restarts."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._ids: set[str] = set()
        if path.exists():
            self._ids = {line.strip() for line in path.read_text().splitlines() if line.strip()}

    def __contains__(self, command_id: object) -> bool:
        return command_id in self._ids

    def add(self, command_id: str) -> None:
        """Remembers ``command_id`` (appended and flushed at once)."""
        if command_id in self._ids:
            return
        self._ids.add(command_id)
        with self._path.open("a") as fh:
            fh.write(command_id + "\n")


class Agent:
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
        attempt = 0
        while not stop.is_set():
            try:
                return await Bus.connect(
                    self.config.nats_url,
                    name=f"cairn-agent-{self.id}",
                    creds=credential.nats_creds if credential else None,
                    inbox_prefix=credential.inbox_prefix if credential else None,
                    # An agent's own NATS user may not manage streams; the relay makes them.
                    manage_streams=credential is None or credential.nats_creds is None,
                )
            except BusUnavailableError as exc:
                attempt += 1
                if attempt in (1, 10) or attempt % 60 == 0:
                    log.warning("NATS unavailable; retrying", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(0.2 * attempt, 2.0))
        return None

    async def _subscribe(self, bus: Bus, stop: asyncio.Event) -> Any:
        """Binds the agent's durable consumer of its command subject, waiting (while the relay
        has not made the command stream yet) until it can."""
        attempt = 0
        while not stop.is_set():
            try:
                return await bus.pull(
                    agent_durable(self.id), [agent_subject(self.id)], stream=COMMANDS_STREAM
                )
            except BusUnavailableError as exc:
                attempt += 1
                if attempt in (1, 10) or attempt % 60 == 0:
                    log.warning("command stream unavailable; retrying", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), min(0.2 * attempt, 2.0))
        return None

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
        )
        self._registered = True
        log.info(
            "registered", agent_id=self.id, slots=len(self.slots), incarnation=self.incarnation
        )

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

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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

    # --- commands -------------------------------------------------------------------------

    async def handle(self, msg: Any) -> None:
        """Executes one command message (idempotently) and acks it once its effect started."""
        try:
            cmd = json.loads(msg.data)
            command_id = str(cmd["command_id"])
            kind = str(cmd["kind"])
            allocation_id = str(cmd["allocation_id"])
        except (ValueError, KeyError, TypeError) as exc:
            log.error("malformed command dropped", error=str(exc), data=msg.data[:200])
            await msg.term()
            return
        if command_id in self.executed:
            log.info("command already executed", command_id=command_id)
            await msg.ack()
            return
        if command_id in self._inflight:
            await msg.in_progress()
            return
        self._inflight.add(command_id)
        log.info("command", command_id=command_id, kind=kind, allocation_id=allocation_id)
        try:
            if kind == "start":
                done = await self._start(allocation_id, msg)
            elif kind == "preempt":
                done = self._preempt(allocation_id)
            elif kind == "kill":
                done = self._kill_command(allocation_id)
            else:
                log.error("unknown command kind", kind=kind, command_id=command_id)
                done = True
            if done:
                self.executed.add(command_id)
                await msg.ack()
            else:
                await msg.nak(delay=2.0)
        except Exception:
            log.exception("command failed", command_id=command_id)
            with contextlib.suppress(Exception):
                await msg.nak(delay=2.0)
        finally:
            self._inflight.discard(command_id)

    async def _start(self, allocation_id: str, msg: Any) -> bool:
        if allocation_id in self.allocations:
            log.info("allocation already known; start is a no-op", allocation_id=allocation_id)
            return True
        alloc = Allocation(allocation_id, listed_from=self._heartbeats + 1)
        self.allocations[allocation_id] = alloc
        alloc.task = asyncio.create_task(self._lifecycle(alloc), name=f"run-{allocation_id}")
        while not alloc.launched.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(alloc.launched.wait(), 10.0)
            if not alloc.launched.is_set():
                await msg.in_progress()  # a slow download must not trigger a redelivery
        if alloc.retry:
            del self.allocations[allocation_id]
            return False
        return True

    def _preempt(self, allocation_id: str) -> bool:
        alloc = self.allocations.get(allocation_id)
        if alloc is None or not alloc.active:
            log.info("preempt for an allocation not running here", allocation_id=allocation_id)
            return True
        alloc.preempt_requested = True
        if not alloc.stop_reason:
            alloc.stop_reason = "preempted"
        if alloc.procs is not None and not alloc.kill_requested:
            timeout = alloc.preempt_timeout
            alloc.signals.append(
                self._spawn(
                    preempt(
                        alloc.procs,
                        self.config.preempt_timeout if timeout is None else timeout,
                        self.config.kill_grace,
                        label=allocation_id,
                    )
                )
            )
        return True

    def _kill_command(self, allocation_id: str) -> bool:
        alloc = self.allocations.get(allocation_id)
        if alloc is None or not alloc.active:
            log.info("kill for an allocation not running here", allocation_id=allocation_id)
            return True
        self._kill(alloc, "killed on request")
        return True

    def _kill(self, alloc: Allocation, reason: str) -> None:
        if alloc.kill_requested:
            return
        alloc.kill_requested = True
        alloc.stop_reason = reason
        if alloc.procs is not None:
            alloc.signals.append(
                self._spawn(
                    terminate(alloc.procs, self.config.kill_grace, label=alloc.allocation_id)
                )
            )

    # --- one run --------------------------------------------------------------------------

    async def _lifecycle(self, alloc: Allocation) -> None:
        aid = alloc.allocation_id
        try:
            await self._run_allocation(alloc)
        except asyncio.CancelledError:
            if alloc.procs is not None:
                alloc.procs.send_signal(signal.SIGKILL)
            raise
        except Exception:
            log.exception("run failed inside the agent", allocation_id=aid)
        finally:
            if alloc.active:
                alloc.state = "exited"
            alloc.launched.set()
            alloc.finished.set()

    async def _run_allocation(self, alloc: Allocation) -> None:
        aid = alloc.allocation_id
        try:
            raw = await self.client.spec(aid, self.id)
        except ApiError as exc:
            if exc.status == 0 or exc.status >= 500 or exc.status in (408, 429):
                log.warning("spec unavailable; the command will be retried", allocation_id=aid)
                alloc.retry = True
            else:
                log.error("spec refused; not starting", allocation_id=aid, error=str(exc))
                alloc.state = "skipped"
            return
        if not raw.get("active", False):
            log.info("allocation no longer active; not starting", allocation_id=aid)
            alloc.state = "skipped"
            return
        work: Path | None = None
        places: RunPlaces | None = None
        try:
            if alloc.kill_requested:
                message = f"{alloc.stop_reason} before the process started"
                await self._report_exit(
                    aid, KILLED_BEFORE_START, message, agent_shutdown=alloc.agent_shutdown
                )
                return
            try:
                default_root = self.config.checkpoint_root or self.config.work_dir / "checkpoints"
                run = RunSpec.from_api(raw, self.id, default_root)
                alloc.preempt_timeout = run.preemption_timeout
                work = prepare_work_dir(self.config.work_dir, aid)
                if run.code_ref:
                    await self.code.unpack(run.code_ref, work)
                device = "cuda" if any(s in self.gpu_slots for s in run.slot_ids) else "cpu"
                image = run_image(run.config, device, self.config.default_image)
                identity = self.confinement.identity_for(run.identity, container=image is not None)
                places = await asyncio.to_thread(
                    self.confinement.prepare,
                    work=work,
                    identity=identity,
                    checkpoint_dir=run.checkpoint_dir,
                    experiment_id=run.experiment_id,
                    trial_id=run.trial_id,
                )
                if run.num_nodes > 1:
                    failure = await self._rendezvous(alloc, run)
                    if failure is not None:
                        log.error("run not started", allocation_id=aid, reason=failure)
                        status = KILLED_BEFORE_START if alloc.kill_requested else RENDEZVOUS_FAILED
                        await self._report_exit(
                            aid, status, failure, agent_shutdown=alloc.agent_shutdown
                        )
                        return
                envs = trial_environment(
                    run, agent_id=self.id, api_url=self.config.api_url, gpu_slots=self.gpu_slots
                )
                for env in envs:
                    env.update(self.confinement.environment(identity, places))
                shipper = LogShipper(self.client, aid, f"{self.id}:{self.incarnation}")
                procs: TrialProcesses | TrialContainers
                if image is not None:
                    procs, self._docker = await launch_containers(
                        self._docker,
                        run,
                        image,
                        envs,
                        shipper,
                        agent_id=self.id,
                        work=work,
                        gpu_slots=self.gpu_slots,
                        kill_grace=self.config.kill_grace,
                        share_from=self.config.docker_share_from,
                        identity=identity,
                        policy=self.config.host_policy,
                    )
                else:
                    procs = TrialProcesses(aid, shipper, self.config.kill_grace)
                    argv = self.confinement.argv(run.argv, identity, places)
                    await procs.launch(argv, work, envs)
                try:
                    record = record_of(aid, procs.pids)
                    await asyncio.to_thread(self.run_processes.keep, record)
                except OSError:
                    procs.send_signal(signal.SIGKILL)  # never run what a restart could not find
                    await procs.wait()
                    raise
            except (
                ValueError,
                KeyError,
                TypeError,
                ApiError,
                OSError,
                tarfile.TarError,
                DockerRuntimeError,
                ConfinementError,
                RunDirectoryError,
            ) as exc:
                log.error("cannot start the run", allocation_id=aid, error=str(exc))
                status = 127 if isinstance(exc, FileNotFoundError) else 1
                await self._report_exit(aid, status, f"agent could not start the run: {exc}")
                return
            shipper.start()
            alloc.procs = procs
            alloc.state = "running"
            log.info(
                "run launched",
                allocation_id=aid,
                pids=procs.pids,
                argv=run.argv,
                uid=identity.uid if identity is not None else os.getuid(),
            )
            alloc.launched.set()
            if alloc.kill_requested:
                alloc.kill_requested = False
                self._kill(alloc, alloc.stop_reason)
            elif alloc.preempt_requested:
                self._preempt(aid)
            started = asyncio.create_task(
                self.client.started(
                    aid, self.id, self.incarnation, alloc.listed_from, f"started:{aid}:{self.id}"
                )
            )
            gang = self._spawn(self._watch_gang(alloc)) if run.num_nodes > 1 else None
            status = await procs.wait()
            if gang is not None:
                if status == 0 and run.node_rank > 0 and not alloc.kill_requested:
                    # A worker part that finished waits for the chief's part to end the run:
                    # its report would end it while the chief still reports and checkpoints.
                    log.info("part finished; waiting for the chief's", allocation_id=aid)
                    await asyncio.wait({gang})
                gang.cancel()
            log.info("run exited", allocation_id=aid, exit_code=status)
            # Kept at once: shipping the last logs and the started report may wait long on an
            # API that is down, and the agent may be killed meanwhile (``cairn down``).
            report = await self._keep_exit(
                aid, status, alloc.stop_reason, agent_shutdown=alloc.agent_shutdown
            )
            try:
                await started  # the API must see TrialStarted before TrialExited
            except ApiError as exc:
                log.error("started report refused", allocation_id=aid, error=str(exc))
            await shipper.close()
            await self._send_exit(report)
        finally:
            alloc.state = "exited"
            if work is not None:
                await asyncio.to_thread(shutil.rmtree, work, True)
            if places is not None:
                await asyncio.to_thread(self.confinement.release, places)

    async def _rendezvous(self, alloc: Allocation, run: RunSpec) -> str | None:
        """Joins the rendezvous of a run placed on several agents and waits for the others.

        Sets the chief's endpoint on ``run`` and returns ``None`` once every agent joined, or
        returns why the run cannot start: the others did not all join within
        ``rendezvous_timeout`` seconds, the run ended meanwhile, or it was killed or preempted
        (the log's kill or preemption request then decides the outcome).
        """
        aid = alloc.allocation_id
        address = self.config.address or reachable_address(self.config.api_url)
        deadline = asyncio.get_running_loop().time() + self.config.rendezvous_timeout
        answer = await self.client.rendezvous_join(
            aid, self.id, address, free_port(), f"rendezvous:{aid}:{self.id}"
        )
        log.info("rendezvous joined", allocation_id=aid, address=address, nodes=answer.nodes)
        while True:
            if alloc.kill_requested or alloc.preempt_requested:
                return f"{alloc.stop_reason} during the rendezvous"
            if not answer.current:
                return "the run ended during the rendezvous"
            if answer.complete:
                if answer.chief_address is None or answer.chief_port is None:
                    raise ValueError(f"rendezvous of {aid} is complete but names no chief")
                if answer.node_rank is None:
                    raise ValueError(f"rendezvous of {aid} is complete but names no node rank")
                run.master_addr = answer.chief_address
                run.master_port = answer.chief_port
                run.node_rank = answer.node_rank
                run.num_nodes = answer.num_nodes
                log.info(
                    "rendezvous complete",
                    allocation_id=aid,
                    chief=f"{run.master_addr}:{run.master_port}",
                    node_rank=run.node_rank,
                )
                return None
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                missing = [a for a in answer.nodes if a not in answer.joined]
                return (
                    f"rendezvous timed out after {self.config.rendezvous_timeout:g}s: "
                    f"agent(s) {', '.join(missing)} never joined"
                )
            answer = await self.client.rendezvous(aid, self.id, min(left, GANG_POLL_SECONDS))

    async def _watch_gang(self, alloc: Allocation) -> None:
        """Stops this agent's part of a gang once the run is no longer current (another agent's
        part failed or was lost, or the chief's part ended it): the survivors must not train on
        alone. Returns once the run is no longer current."""
        aid = alloc.allocation_id
        while alloc.active:
            try:
                answer = await self.client.preemption(aid, GANG_POLL_SECONDS)
            except ApiError as exc:
                log.warning("gang watch failing", allocation_id=aid, error=str(exc))
                await asyncio.sleep(1.0)
                continue
            if not answer.current:
                if alloc.procs is not None and not alloc.procs.done:
                    log.warning("another part of the gang ended; stopping", allocation_id=aid)
                    self._kill(alloc, "another part of the gang ended")
                return

    async def _report_exit(
        self, allocation_id: str, exit_code: int, message: str, *, agent_shutdown: bool = False
    ) -> None:
        """Reports a run's exit, kept on disk until the API answers (see ``_announce``)."""
        report = await self._keep_exit(
            allocation_id, exit_code, message, agent_shutdown=agent_shutdown
        )
        await self._send_exit(report)

    async def _keep_exit(
        self, allocation_id: str, exit_code: int, message: str, *, agent_shutdown: bool = False
    ) -> ExitReport:
        report = ExitReport(
            allocation_id,
            exit_code,
            message,
            f"exited:{allocation_id}:{self.id}",
            agent_shutdown=agent_shutdown,
        )
        await asyncio.to_thread(self.unreported.keep, report)
        return report

    async def _send_exit(self, report: ExitReport) -> None:
        await faults.point("agent.before_exit_report")
        aid = report.allocation_id
        try:
            await self.client.exited(
                aid,
                self.id,
                report.exit_code,
                report.message,
                report.key,
                agent_shutdown=report.agent_shutdown,
            )
        except ApiError as exc:  # refused for good (retryable failures are retried forever)
            log.error("exit report refused", allocation_id=aid, error=str(exc))
        else:
            log.info("exit reported", allocation_id=aid, exit_code=report.exit_code)
        self.unreported.done(aid)
        self.run_processes.done(aid)
