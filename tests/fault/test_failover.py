"""Fenced failover with real processes: a paused or killed leader is replaced by a standby, and
an ex-leader's writes are refused by the fence."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

import psutil

from events.domain.check import check_log
from events.log.lease import LeaderLease
from events.log.store import EventStore, lease_stream
from tests.helpers import spawn, wait_for_line, wait_until


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal (the SIGSTOP took effect)."""
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


async def test_paused_leader_is_replaced_and_its_next_write_is_fenced(
    store: EventStore, db_url: str, service_env: Callable[..., dict[str, str]]
) -> None:
    """SIGSTOP a lease holder that writes under its fence: a standby is elected while it is
    paused; after SIGCONT its next write is refused (FencedError) and nothing it sent after the
    election is in the log."""
    env = service_env(CAIRN_LEASE_TIMEOUT="1.0")
    leader = spawn("tests.fault.procs.fenced_writer", db_url, "decider", "experiment-1", env=env)
    try:
        await asyncio.to_thread(wait_for_line, leader, "LEADING 1")
        await wait_until(lambda: _version(store, "experiment-1", 3), timeout=30)
        os.kill(leader.pid, signal.SIGSTOP)
        await wait_until(lambda: stopped(leader.pid), timeout=10)
        standby = await asyncio.wait_for(LeaderLease.acquire(store, "decider", timeout=1.0), 60)
        assert standby is not None and standby.epoch == 2
        assert stopped(leader.pid), "the standby was elected while the leader was paused"
        os.kill(leader.pid, signal.SIGCONT)
        await asyncio.to_thread(wait_for_line, leader, "FENCED 1")
        assert await asyncio.to_thread(leader.wait, 30) == 0, leader.stderr.read()
        election = (await store.read_stream(lease_stream("decider")))[-1]
        assert election.stream_version == 2
        late = [e for e in await store.read_all(election.position, limit=10_000)]
        assert late == [], "the ex-leader wrote nothing after the election"
        assert await check_log(store) == []
        await standby.release()
    finally:
        if leader.poll() is None:
            os.kill(leader.pid, signal.SIGCONT)
            leader.kill()
            leader.wait(10)


async def _version(store: EventStore, stream: str, at_least: int) -> bool:
    return await store.stream_version(stream) >= at_least
