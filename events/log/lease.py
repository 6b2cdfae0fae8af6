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
import concurrent.futures
import contextlib
import contextvars
import hashlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import structlog

from events import settings
from events.domain.types.system import LeaderElected
from events.log import db
from events.log.envelope import NewEvent
from events.log.errors import EventsError, StoreUnavailableError
from events.log.store import EventStore, Fence, lease_stream

LEASE_TIMEOUT = settings.LEASE_TIMEOUT.default
"""Seconds after which the session of a paused lease holder is ended (``CAIRN_LEASE_TIMEOUT``)."""
PROBES_PER_TIMEOUT = 5
"""How many times per lease timeout the holder proves it is alive."""

log = structlog.get_logger("lease")


def lease_timeout() -> float:
    """The lease timeout in seconds: ``CAIRN_LEASE_TIMEOUT`` if set, else :data:`LEASE_TIMEOUT`.

    Raises:
        events.settings.SettingError: ``CAIRN_LEASE_TIMEOUT`` is not a positive number.
    """
    return settings.LEASE_TIMEOUT.get()


def lock_key(lease: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``lease``."""
    digest = hashlib.blake2b(f"cairn-lease:{lease}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def default_holder() -> str:
    """Identifies this process in ``LeaderElected`` events: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaderLease:
    """A held lease. Keep it open while leading; :attr:`lost` is set if the session dies.

    The lock's session lives in a thread of its own with its own event loop (a
    :class:`_Keeper`), so a leader whose event loop is busy (a long fold on a loaded machine)
    still proves it is alive; only a paused or dead process stops the probes.
    """

    def __init__(self, name: str, keeper: _Keeper, epoch: int) -> None:
        self.name = name
        self.epoch = epoch
        self.fence = Fence(name, epoch)
        self.lost = asyncio.Event()
        self._keeper = keeper
        loop = asyncio.get_running_loop()
        keeper.on_lost(lambda: _call_in(loop, self.lost.set))

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
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        standby = (lambda: _call_in(loop, lambda: context.run(on_standby))) if on_standby else None
        keeper = _Keeper(store.dsn, name, timeout or lease_timeout(), standby)
        keeper.start()
        granted: asyncio.Future[Any] = asyncio.wrap_future(keeper.granted)
        waits = [granted]
        if stop is not None:
            waits.append(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await keeper.close()
            raise
        finally:
            for task in waits[1:]:
                task.cancel()
        if not granted.done():
            await keeper.close()
            return None
        if granted.cancelled() or granted.exception() is not None:
            await keeper.close()
            if granted.cancelled():
                raise StoreUnavailableError(f"lease {name}: the session ended while waiting")
            granted.result()  # raises the keeper's error
        lease = cls(name, keeper, 0)
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

    async def release(self) -> None:
        """Gives the lease up by closing its session."""
        self.lost.set()
        await self._keeper.close()


def _call_in(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    """Runs ``callback`` in ``loop`` (from another thread) in the context of the caller of
    :meth:`LeaderLease.acquire` (its log bindings); nothing if that loop has ended."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


class _Keeper(threading.Thread):
    """Holds a lease's session in a thread with its own event loop: takes the lock (blocking
    in ``pg_advisory_lock``, granted the moment the holder's session ends), then probes the
    session often enough that the server never finds it idle for a whole timeout."""

    def __init__(
        self, dsn: str, name: str, timeout: float, on_standby: Callable[[], object] | None
    ) -> None:
        super().__init__(name=f"lease-{name}", daemon=True)
        self.granted: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._dsn = dsn
        self._lease = name
        self._timeout = timeout
        self._on_standby = on_standby
        self._lost_callbacks: list[Callable[[], object]] = []
        self._lost = False
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None
        self._looping = threading.Event()

    def on_lost(self, callback: Callable[[], object]) -> None:
        """Calls ``callback`` (from the keeper's thread) once the session is gone."""
        with self._guard:
            if not self._lost:
                self._lost_callbacks.append(callback)
                return
        callback()

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self._looping.set()
            self._mark_lost()

    async def close(self) -> None:
        """Ends the session (releasing the lock) and waits for the thread."""
        await asyncio.to_thread(self._looping.wait)
        loop, stop = self._loop, self._halt
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                loop.call_soon_threadsafe(stop.set)
        await asyncio.to_thread(self.join)

    def _mark_lost(self) -> None:
        with self._guard:
            self._lost = True
            callbacks, self._lost_callbacks = self._lost_callbacks, []
        for callback in callbacks:
            callback()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._halt = asyncio.Event()
        self._looping.set()
        try:
            conn = await db.connect(
                self._dsn,
                settings={
                    "idle_session_timeout": str(max(1, int(self._timeout * 1000))),
                    "application_name": f"cairn-lease:{self._lease}",
                },
            )
        except BaseException as exc:
            self.granted.set_exception(exc)
            return
        conn.add_termination_listener(lambda _conn: self._halt_soon())
        try:
            if await self._take(conn):
                self.granted.set_result(None)
                await self._hold(conn)
        except BaseException as exc:
            if not self.granted.done():
                self.granted.set_exception(
                    exc if isinstance(exc, EventsError) else StoreUnavailableError(str(exc))
                )
        finally:
            if not self.granted.done():
                self.granted.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)
            if not conn.is_closed():
                conn.terminate()

    def _halt_soon(self) -> None:
        if self._halt is not None:
            self._halt.set()

    async def _take(self, conn: db.Connection) -> bool:
        """Takes the lock; ``False`` if told to stop first."""
        assert self._halt is not None
        key = lock_key(self._lease)
        if await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
            return True
        if self._on_standby is not None:
            self._on_standby()
        waiting = asyncio.ensure_future(conn.fetchval("SELECT pg_advisory_lock($1)", key))
        stopping = asyncio.ensure_future(self._halt.wait())
        await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if waiting.done():
            waiting.result()
            return True
        waiting.cancel()
        with contextlib.suppress(BaseException):
            await waiting
        return False

    async def _hold(self, conn: db.Connection) -> None:
        """Probes the session until told to stop or the session fails."""
        assert self._halt is not None
        interval = self._timeout / PROBES_PER_TIMEOUT
        while not self._halt.is_set():
            try:
                await asyncio.wait_for(conn.fetchval("SELECT 1"), self._timeout)
            except Exception:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._halt.wait(), interval)
