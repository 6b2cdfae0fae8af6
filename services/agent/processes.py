"""The processes of one run on this agent: one per local rank, each the leader of its own
process group, their output captured line by line (:mod:`services.agent.log_shipping`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import structlog

from services.agent.log_shipping import LogShipper
from services.agent.signals import exit_status, terminate

log = structlog.get_logger("agent")

STREAM_LIMIT = 1 << 20


class RunRanks:
    """The ranks of one run on this agent, however they run (processes here, containers in
    :mod:`services.agent.docker_runtime`): whether they have all exited, a wait for that, and
    the stopping of the others when one rank fails.

    Args:
        allocation_id: the run.
        shipper: where output lines go.
        kill_grace: seconds between SIGTERM and SIGKILL when one rank fails and the others are
            stopped.
    """

    def __init__(self, allocation_id: str, shipper: LogShipper, kill_grace: float) -> None:
        self.allocation_id = allocation_id
        self.shipper = shipper
        self.kill_grace = kill_grace
        self._exited = asyncio.Event()
        self._helpers: set[asyncio.Task[None]] = set()
        self.exit_code: int | None = None

    @property
    def done(self) -> bool:
        """True once every rank has exited."""
        return self._exited.is_set()

    async def wait_for_exit(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` seconds for every rank to exit."""
        try:
            await asyncio.wait_for(self._exited.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to every rank still running."""
        raise NotImplementedError

    def _stop_the_others(self) -> None:
        """Stops the ranks still running (SIGTERM, SIGKILL after the grace), in the background."""
        helper = asyncio.create_task(terminate(self, self.kill_grace))
        self._helpers.add(helper)
        helper.add_done_callback(self._helpers.discard)


class TrialProcesses(RunRanks):
    """The processes of one run on this agent (one per local rank), with output capture (the
    arguments are :class:`RunRanks`')."""

    def __init__(self, allocation_id: str, shipper: LogShipper, kill_grace: float) -> None:
        super().__init__(allocation_id, shipper, kill_grace)
        self.procs: list[asyncio.subprocess.Process] = []
        self._pumps: list[asyncio.Task[None]] = []

    @property
    def pids(self) -> list[int]:
        """The process ids (each the leader of its own process group)."""
        return [p.pid for p in self.procs]

    async def launch(self, argv: list[str], cwd: Path, envs: list[dict[str, str]]) -> None:
        """Starts one process per environment in ``envs``.

        Raises:
            OSError: a process could not be started (the ones already started are killed).
        """
        multi = len(envs) > 1
        try:
            for rank, env in enumerate(envs):
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    cwd=str(cwd),
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                    limit=STREAM_LIMIT,
                )
                self.procs.append(proc)
                label = int(env.get("RANK", rank)) if multi else 0
                assert proc.stdout is not None and proc.stderr is not None
                self._pumps.append(asyncio.create_task(self._pump(proc.stdout, label, "stdout")))
                self._pumps.append(asyncio.create_task(self._pump(proc.stderr, label, "stderr")))
        except OSError:
            self.send_signal(signal.SIGKILL)
            for proc in self.procs:
                await proc.wait()
            for pump in self._pumps:
                pump.cancel()
            raise

    async def _pump(self, stream: asyncio.StreamReader, rank: int, name: str) -> None:
        while True:
            try:
                chunk = await stream.readuntil(b"\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    self.shipper.add(rank, name, exc.partial.decode(errors="replace"))
                return
            except asyncio.LimitOverrunError as exc:
                chunk = await stream.readexactly(exc.consumed)
            self.shipper.add(rank, name, chunk.decode(errors="replace").rstrip("\r\n"))

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to the process group of every process still running."""
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)

    async def wait(self) -> int:
        """Waits for every process; stops the others when one rank fails.

        Returns:
            The run's exit status: the first non-zero status (``128 + N`` for signal N), else 0.
        """
        waits = {asyncio.create_task(p.wait()): p for p in self.procs}
        first_failure: int | None = None
        pending = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                status = exit_status(task.result())
                if status != 0 and first_failure is None:
                    first_failure = status
                    if pending:
                        log.warning(
                            "a rank failed; stopping the others",
                            allocation_id=self.allocation_id,
                            status=status,
                        )
                        self._stop_the_others()
        # Stragglers in the process groups (orphaned children) would keep the pipes open.
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.exit_code = first_failure or 0
        self._exited.set()
        _, late = await asyncio.wait(self._pumps, timeout=5.0)
        for pump in late:
            pump.cancel()
        return self.exit_code
