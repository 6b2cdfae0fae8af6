"""Stopping a trial's processes: preempt (wait for a clean exit) and kill (SIGTERM, SIGKILL).

Every trial process is the leader of its own process group, so a signal reaches the whole tree
(data-loader workers, shells, anything it spawned). The trial learns about a preemption from the
API's long poll (the Core API's watcher); the agent's part is only the deadline.
"""

from __future__ import annotations

import signal
from typing import Protocol

import structlog

log = structlog.get_logger("agent")


class ProcessGroup(Protocol):
    """What the signalling helpers need from a running trial."""

    @property
    def done(self) -> bool:
        """True once every process has exited."""
        ...

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to every process group of the trial."""
        ...

    async def wait_for_exit(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` seconds for every process to exit; True if they did."""
        ...


async def terminate(group: ProcessGroup, grace: float, *, label: str = "") -> None:
    """SIGTERM, then SIGKILL if the processes are still alive ``grace`` seconds later."""
    if group.done:
        return
    log.info("sending SIGTERM", allocation_id=label, grace=grace)
    group.send_signal(signal.SIGTERM)
    if await group.wait_for_exit(grace):
        return
    log.warning("still alive after SIGTERM; sending SIGKILL", allocation_id=label)
    group.send_signal(signal.SIGKILL)
    await group.wait_for_exit(None)


async def preempt(group: ProcessGroup, timeout: float, grace: float, *, label: str = "") -> None:
    """Waits ``timeout`` seconds for the trial to checkpoint and exit, then :func:`terminate`."""
    if await group.wait_for_exit(timeout):
        return
    log.warning("no exit within the preemption timeout", allocation_id=label, timeout=timeout)
    await terminate(group, grace, label=label)


def exit_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: ``128 + N`` when killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode
