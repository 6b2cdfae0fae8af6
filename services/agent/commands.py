"""The agent's commands (``start``, ``preempt``, ``kill``) from its NATS queue.

Each command id is executed at most once: the ids already executed are remembered in
``<work_dir>/executed-commands`` (:class:`CommandLog`), so a restarted agent does not repeat
them; a message is acked once its effect has started (process launched, signal sent). An
allocation is started at most once however many ``start`` commands name it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import structlog

from services.agent.signals import preempt, terminate
from services.agent.state import AgentState, Allocation

log = structlog.get_logger("agent")


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


class CommandHandling(AgentState):
    """Executes the command messages of the agent's queue."""

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
