"""Run processes that outlived the agent process that started them, found and stopped.

Every trial process leads its own session (so a signal reaches everything it spawned), which
also means a SIGKILLed agent takes none of them down: they keep training, burning slots and
writing checkpoints next to the restarted run's. So each launched run is recorded in
``<work_dir>/run-processes/``, one JSON file per run written durably before the run is announced
as started, naming each of its process groups by leader pid *and* that process's start time; the
record is removed once the run's exit has been reported. A new agent process, before it
registers, SIGKILLs every group a record names that still exists and waits until it is gone.

The start time makes a record immune to pid reuse: on Linux a pid is not handed out again while a
process group of that id still has members, so a leader pid that now belongs to a process started
at another time means the recorded group is gone, and nothing is killed. When the leader itself
has exited but members of its group remain, a member is only killed if it started after the
leader and still carries the run's ``CAIRN_ALLOCATION_ID`` in its environment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import structlog

from events import settings
from services.agent.records import RecordDirectory

log = structlog.get_logger("agent")

START_TIME_TOLERANCE = 0.5
"""Seconds two readings of one process's start time may differ by (the OS derives it from the
boot time, which clock adjustments may move)."""

KILL_TIMEOUT = 30.0
"""How long a new agent waits for a leftover group to disappear after SIGKILL."""


@dataclass(frozen=True)
class GroupRecord:
    """One process group of a run: its leader's pid and start time (seconds since the epoch)."""

    pid: int
    create_time: float


@dataclass(frozen=True)
class RunRecord:
    """The process groups of one run (one per local rank)."""

    allocation_id: str
    groups: tuple[GroupRecord, ...]


def create_time(pid: int) -> float | None:
    """The start time of process ``pid`` as the OS reports it, or ``None`` if there is none."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def record_of(allocation_id: str, pids: list[int]) -> RunRecord:
    """A record of the run's groups, read now (a leader that is already gone is left out)."""
    groups = []
    for pid in pids:
        started = create_time(pid)
        if started is not None:
            groups.append(GroupRecord(pid, started))
    return RunRecord(allocation_id, tuple(groups))


class RunProcesses:
    """One record per run whose processes may still exist, under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self._records = RecordDirectory(directory, "run process record")

    def keep(self, record: RunRecord) -> None:
        """Writes ``record`` durably."""
        self._records.write(record.allocation_id, asdict(record))

    def done(self, allocation_id: str) -> None:
        """Forgets the run of ``allocation_id`` (its exit was reported)."""
        self._records.remove(allocation_id)

    def records(self) -> list[RunRecord]:
        """Every record kept and not yet done; unreadable files are dropped with an error."""
        return self._records.read_all(_run_record)


def _run_record(raw: dict[str, Any]) -> RunRecord:
    groups = tuple(GroupRecord(int(g["pid"]), float(g["create_time"])) for g in raw["groups"])
    return RunRecord(str(raw["allocation_id"]), groups)


def _same_start(proc: psutil.Process, started: float) -> bool:
    return abs(proc.create_time() - started) <= START_TIME_TOLERANCE


def _carries(proc: psutil.Process, allocation_id: str) -> bool:
    try:
        return settings.ALLOCATION_ID.get(proc.environ()) == allocation_id
    except (psutil.Error, OSError):
        return False


def _leader_is_ours(group: GroupRecord) -> bool | None:
    """Whether the recorded leader still exists (True), was replaced by another process under
    its pid (``None``: the recorded group is gone), or has exited (False)."""
    try:
        return True if _same_start(psutil.Process(group.pid), group.create_time) else None
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return None


def members(allocation_id: str, group: GroupRecord) -> list[psutil.Process]:
    """The live (not zombie) processes of the recorded group; empty if the group is gone.

    Args:
        allocation_id: the run the group belongs to.
        group: the recorded leader.
    """
    leader = _leader_is_ours(group)
    if leader is None:
        return []
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != group.pid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if not leader and (
                proc.create_time() + START_TIME_TOLERANCE < group.create_time
                or not _carries(proc, allocation_id)
            ):
                continue
            found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_group(allocation_id: str, group: GroupRecord, timeout: float = KILL_TIMEOUT) -> bool:
    """SIGKILLs what is left of a recorded group and waits until it is gone.

    Returns:
        True once nothing of the group runs (at once if nothing did); False if some process
        survived ``timeout`` seconds (stuck in the kernel, or not ours to signal).
    """
    left = members(allocation_id, group)
    if not left:
        return True
    log.warning(
        "killing a run process group left by an earlier agent process",
        allocation_id=allocation_id,
        pgid=group.pid,
        pids=[p.pid for p in left],
    )
    deadline = time.monotonic() + timeout
    while left:
        if _leader_is_ours(group):
            # A session leader cannot leave its group, so while it exists the group id is ours.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group.pid, signal.SIGKILL)
        else:
            for proc in left:  # each was just checked as a member of the recorded group
                with contextlib.suppress(psutil.Error, OSError):
                    proc.send_signal(signal.SIGKILL)
        if time.monotonic() > deadline:
            log.error(
                "run processes survived SIGKILL",
                allocation_id=allocation_id,
                pids=[p.pid for p in left],
            )
            return False
        time.sleep(0.05)
        left = members(allocation_id, group)
    return True


def kill_leftovers(runs: RunProcesses, timeout: float = KILL_TIMEOUT) -> list[str]:
    """Stops every recorded run's processes that still exist and forgets those runs.

    A record whose processes could not all be stopped is kept, so the next agent process tries
    again.

    Returns:
        The allocation ids whose processes were still running.
    """
    killed = []
    for record in runs.records():
        alive = any(members(record.allocation_id, g) for g in record.groups)
        gone = all(kill_group(record.allocation_id, g, timeout) for g in record.groups)
        if alive:
            killed.append(record.allocation_id)
        if gone:
            runs.done(record.allocation_id)
            if alive:
                log.info("left-over run stopped", allocation_id=record.allocation_id)
    return killed
