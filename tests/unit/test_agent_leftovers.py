"""Run processes left by an earlier agent process: recorded by leader pid and start time, and
killed by a new agent process only when the record still names them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from services.agent.leftovers import (
    GroupRecord,
    RunProcesses,
    RunRecord,
    kill_leftovers,
    members,
    record_of,
)
from tests.helpers import group_pids, process_alive

ALLOCATION = "7.1.1"


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Shell process groups started by a test (each in its own session), SIGKILLed after it."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        for pid in group_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)


def start_group(
    procs: list[subprocess.Popen[bytes]], script: str, allocation_id: str | None = ALLOCATION
) -> subprocess.Popen[bytes]:
    """``sh -c script`` leading a new session, as the agent starts a run's process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    if allocation_id is not None:
        env["CAIRN_ALLOCATION_ID"] = allocation_id
    proc = subprocess.Popen(["sh", "-c", script], env=env, start_new_session=True)
    procs.append(proc)
    return proc


def wait_for_members(pgid: int, count: int) -> None:
    """Blocks until the group has ``count`` live processes (the shell forked its children)."""
    for _ in range(2000):
        if len(group_pids(pgid)) >= count:
            return
        psutil.wait_procs([], timeout=0.01)
    raise AssertionError(f"group {pgid} never had {count} processes")


def test_record_round_trips_and_done_forgets(tmp_path: Path) -> None:
    """A kept record reads back as written; ``done`` removes it; a corrupt file is dropped."""
    runs = RunProcesses(tmp_path / "runs")
    record = RunRecord(ALLOCATION, (GroupRecord(123, 1700000000.25), GroupRecord(124, 1.5)))
    runs.keep(record)
    (tmp_path / "runs" / "garbage.json").write_text("{not json")
    assert runs.records() == [record]
    assert not (tmp_path / "runs" / "garbage.json").exists()
    runs.done(ALLOCATION)
    runs.done(ALLOCATION)
    assert runs.records() == []


def test_leftover_group_is_killed_whole_and_forgotten(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A recorded group whose leader still runs is SIGKILLed with every member (the leader and
    the children it forked), and its record is removed once nothing of it runs."""
    proc = start_group(spawned, "sleep 300 & sleep 300; wait")
    wait_for_members(proc.pid, 3)
    runs = RunProcesses(tmp_path / "runs")
    runs.keep(record_of(ALLOCATION, [proc.pid]))
    before = group_pids(proc.pid)
    assert len(before) == 3, "the fault: a live group of three processes is left over"

    assert kill_leftovers(runs) == [ALLOCATION]

    assert group_pids(proc.pid) == []
    assert proc.wait(10) == -signal.SIGKILL
    assert runs.records() == []


def test_reused_pid_is_not_killed(tmp_path: Path, spawned: list[subprocess.Popen[bytes]]) -> None:
    """A record whose start time does not match the process now holding that pid (the pid was
    reused) kills nothing: that process and its group keep running; the stale record goes."""
    proc = start_group(spawned, "sleep 300 & sleep 300; wait")
    wait_for_members(proc.pid, 3)
    started = psutil.Process(proc.pid).create_time()
    runs = RunProcesses(tmp_path / "runs")
    runs.keep(RunRecord(ALLOCATION, (GroupRecord(proc.pid, started - 3600.0),)))

    assert members(ALLOCATION, GroupRecord(proc.pid, started - 3600.0)) == []
    assert kill_leftovers(runs) == []

    assert len(group_pids(proc.pid)) == 3
    assert process_alive(proc.pid)
    assert runs.records() == []


def test_members_outliving_their_leader_are_killed_only_if_they_are_the_runs(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """When the recorded leader has exited, the members left in its group are killed if they
    carry the run's allocation id in their environment, and left alone if they do not."""
    ours = start_group(spawned, "sleep 300 & exit 0")
    theirs = start_group(spawned, "sleep 300 & exit 0", allocation_id=None)
    records = []
    for proc, allocation_id in ((ours, ALLOCATION), (theirs, "7.2.1")):
        records.append(record_of(allocation_id, [proc.pid]))
        assert proc.wait(10) == 0
        wait_for_members(proc.pid, 1)
    assert not process_alive(ours.pid) and not process_alive(theirs.pid), "the leaders have exited"
    runs = RunProcesses(tmp_path / "runs")
    for record in records:
        runs.keep(record)
    [orphan] = group_pids(ours.pid)
    [stranger] = group_pids(theirs.pid)

    assert kill_leftovers(runs) == [ALLOCATION]

    assert not process_alive(orphan)
    assert process_alive(stranger)
    assert runs.records() == []
