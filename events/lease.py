"""Leader leases: a PostgreSQL advisory lock held by a session, plus an epoch recorded in the log.

The holder appends ``LeaderElected`` to ``lease-<name>``; the stream version of that event is
its epoch. Every write the leader makes passes ``Fence(name, epoch)``, which the store checks
inside the append transaction, so a paused or partitioned ex-leader cannot write once a newer
leader has been elected.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket

from events import db
from events.envelope import NewEvent
from events.store import EventStore, Fence, lease_stream
from events.types.system import LeaderElected


def lock_key(lease: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``lease``."""
    digest = hashlib.blake2b(f"cairn-lease:{lease}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def default_holder() -> str:
    """Identifies this process in ``LeaderElected`` events: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaderLease:
    """A held lease. Keep it open while leading; :attr:`lost` is set if the session dies."""

    def __init__(self, name: str, conn: db.Connection, epoch: int) -> None:
        self.name = name
        self.epoch = epoch
        self.fence = Fence(name, epoch)
        self.lost = asyncio.Event()
        self._conn = conn
        conn.add_termination_listener(lambda _conn: self.lost.set())

    @classmethod
    async def acquire(
        cls,
        store: EventStore,
        name: str,
        *,
        holder: str | None = None,
        poll: float = 0.5,
        stop: asyncio.Event | None = None,
    ) -> LeaderLease | None:
        """Waits until this process holds ``name``; returns ``None`` if ``stop`` is set first."""
        conn = await db.connect(store.dsn)
        key = lock_key(name)
        try:
            while True:
                with db.translate_errors():
                    got = await conn.fetchval("SELECT pg_try_advisory_lock($1)", key)
                if got:
                    break
                if stop is not None and stop.is_set():
                    await conn.close()
                    return None
                await asyncio.sleep(poll)
            recorded = await store.append(
                lease_stream(name),
                [NewEvent(event=LeaderElected(lease=name, holder=holder or default_holder()))],
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        lease = cls(name, conn, recorded[-1].stream_version)
        asyncio.get_running_loop().create_task(lease._watch())
        return lease

    async def _watch(self, interval: float = 1.0) -> None:
        """Probes the lock's session so a silently dropped connection is noticed."""
        while not self.lost.is_set():
            await asyncio.sleep(interval)
            try:
                await asyncio.wait_for(self._conn.fetchval("SELECT 1"), 5)
            except Exception:
                self.lost.set()

    async def release(self) -> None:
        """Gives the lease up by closing its session."""
        self.lost.set()
        with contextlib.suppress(Exception):
            await self._conn.close()
