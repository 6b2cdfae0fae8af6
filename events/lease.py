"""Leader leases: a PostgreSQL advisory lock held by a session, plus an epoch recorded in the log.

The holder appends ``LeaderElected`` to ``lease-<name>``; the stream version of that event is
its epoch. Every write the leader makes passes ``Fence(name, epoch)``, which the store checks
inside the append transaction, so a paused or partitioned ex-leader cannot write once a newer
leader has been elected.

Invariant (liveness): the lock's session runs with ``idle_session_timeout`` set to the lease
timeout, and the holder probes it several times per timeout. A holder that dies closes the
session at once; a holder that is paused (SIGSTOP, a stalled VM) stops probing, so PostgreSQL
ends its idle session after the timeout and the lock passes to a waiting standby. TCP keepalive
would not do: the kernel of a stopped process still answers it. Safety never rests on this
timeout; it rests on the fence, which the standby's ``LeaderElected`` moves past the old epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from collections.abc import Callable

import structlog

from events import db
from events.envelope import NewEvent
from events.store import EventStore, Fence, lease_stream
from events.types.system import LeaderElected

LEASE_TIMEOUT = 1.5
"""Seconds after which the session of a paused lease holder is ended (``CAIRN_LEASE_TIMEOUT``)."""
PROBES_PER_TIMEOUT = 5
"""How many times per lease timeout the holder proves it is alive."""

log = structlog.get_logger("lease")


def lease_timeout() -> float:
    """The lease timeout in seconds: ``CAIRN_LEASE_TIMEOUT`` if set, else :data:`LEASE_TIMEOUT`."""
    raw = os.environ.get("CAIRN_LEASE_TIMEOUT", "")
    try:
        value = float(raw) if raw else LEASE_TIMEOUT
    except ValueError:
        value = LEASE_TIMEOUT
    return value if value > 0 else LEASE_TIMEOUT


def lock_key(lease: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``lease``."""
    digest = hashlib.blake2b(f"cairn-lease:{lease}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def default_holder() -> str:
    """Identifies this process in ``LeaderElected`` events: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaderLease:
    """A held lease. Keep it open while leading; :attr:`lost` is set if the session dies."""

    def __init__(self, name: str, conn: db.Connection, epoch: int, timeout: float) -> None:
        self.name = name
        self.epoch = epoch
        self.fence = Fence(name, epoch)
        self.lost = asyncio.Event()
        self._conn = conn
        self._timeout = timeout
        conn.add_termination_listener(lambda _conn: self.lost.set())
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    @classmethod
    async def acquire(
        cls,
        store: EventStore,
        name: str,
        *,
        holder: str | None = None,
        stop: asyncio.Event | None = None,
        on_standby: Callable[[], None] | None = None,
        timeout: float | None = None,
    ) -> LeaderLease | None:
        """Waits until this process holds ``name``; returns ``None`` if ``stop`` is set first.

        Args:
            store: the log the election is recorded in.
            name: the lease.
            holder: who is elected (default: host and pid).
            stop: gives up waiting when set.
            on_standby: called once if another session holds the lease when this one asks.
            timeout: the lease timeout in seconds (default: :func:`lease_timeout`).
        """
        timeout = timeout or lease_timeout()
        millis = str(max(1, int(timeout * 1000)))
        conn = await db.connect(
            store.dsn,
            settings={"idle_session_timeout": millis, "application_name": f"cairn-lease:{name}"},
        )
        key = lock_key(name)
        try:
            with db.translate_errors():
                got = await conn.fetchval("SELECT pg_try_advisory_lock($1)", key)
            if not got:
                if on_standby is not None:
                    on_standby()
                if not await _wait_for_lock(conn, key, stop):
                    await conn.close()
                    return None
            lease = cls(name, conn, 0, timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                conn.terminate()
            raise
        try:
            recorded = await store.append(
                lease_stream(name),
                [NewEvent(event=LeaderElected(lease=name, holder=holder or default_holder()))],
            )
        except BaseException:
            await lease.release()
            raise
        lease.epoch = recorded[-1].stream_version
        lease.fence = Fence(name, lease.epoch)
        log.info("lease acquired", lease=name, epoch=lease.epoch)
        return lease

    async def _watch(self) -> None:
        """Probes the lock's session often enough that the server never finds it idle for a
        whole timeout while this process runs, and notices a session the server ended."""
        interval = self._timeout / PROBES_PER_TIMEOUT
        while not self.lost.is_set():
            try:
                await asyncio.wait_for(self._conn.fetchval("SELECT 1"), self._timeout)
            except Exception:
                self.lost.set()
                return
            await asyncio.sleep(interval)

    async def release(self) -> None:
        """Gives the lease up by closing its session."""
        self.lost.set()
        self._watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watcher
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._conn.close(), 2)
        if not self._conn.is_closed():
            self._conn.terminate()


async def _wait_for_lock(conn: db.Connection, key: int, stop: asyncio.Event | None) -> bool:
    """Blocks in ``pg_advisory_lock`` (granted the moment the holder's session ends) until it is
    granted (``True``) or ``stop`` is set (``False``)."""
    waiting = asyncio.ensure_future(conn.fetchval("SELECT pg_advisory_lock($1)", key))
    stopping = asyncio.ensure_future(stop.wait()) if stop is not None else None
    pending = {waiting} if stopping is None else {waiting, stopping}
    try:
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if stopping is not None:
            stopping.cancel()
    if waiting.done():
        with db.translate_errors():
            waiting.result()
        return True
    waiting.cancel()
    with contextlib.suppress(BaseException):
        await waiting
    return False
