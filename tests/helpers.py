"""Shared test helpers: polling, subprocess control, and a consumer that records its effects."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from cairn.local.servers import ServerProcess
from events.log.consumer import Consumer
from events.log.envelope import RecordedEvent
from events.log.store import EventStore, Transaction

ROOT = Path(__file__).resolve().parent.parent

ADMIN_PASSWORD = "test-admin-password"
"""The initial admin's password in the clusters tests start themselves (``cairn up`` generates
one instead)."""


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left to a non-reaping init counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_pids(pgid: int) -> list[int]:
    """The live (not zombie) processes in process group ``pgid``."""
    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
    return out


def run_pids(allocation_id: str) -> list[int]:
    """The live processes an agent started for ``allocation_id`` (found by the
    ``CAIRN_ALLOCATION_ID`` in their environment)."""
    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if (
                proc.environ().get("CAIRN_ALLOCATION_ID") == allocation_id
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                out.append(proc.pid)
    return out


async def wait_until(
    predicate: Callable[[], object],
    timeout: float = 20.0,
    every: float = 0.05,
    *,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Polls ``predicate`` (sync or async) until it is truthy and returns that value; fails the
    test on timeout, with ``detail()`` (e.g. the services' logs) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(timeout, detail))
        await asyncio.sleep(every)


def wait_until_sync(
    predicate: Callable[[], object],
    timeout: float = 20.0,
    every: float = 0.05,
    *,
    detail: Callable[[], str] | None = None,
) -> Any:
    """:func:`wait_until` for synchronous tests: polls a plain function from this thread."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            raise TypeError("an async predicate needs wait_until, not wait_until_sync")
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(timeout, detail))
        time.sleep(every)


def _timed_out(timeout: float, detail: Callable[[], str] | None) -> str:
    message = f"condition not met within {timeout}s"
    return f"{message}\n{detail()}" if detail is not None else message


def wait_for_line(proc: subprocess.Popen[str], needle: str, timeout: float = 30.0) -> str:
    """Reads ``proc``'s stderr until a line contains ``needle``; returns the lines read."""
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"{needle!r} not seen; stderr so far:\n{''.join(seen)}")


def spawn(module: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Starts ``python -m module args`` with stderr piped for :func:`wait_for_line`."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


EFFECTS_DDL = """CREATE TABLE IF NOT EXISTS effects (
    consumer text NOT NULL, event_id uuid NOT NULL, position bigint NOT NULL)"""


class EffectsConsumer(Consumer):
    """Records one row per applied event, with no unique key, so a double apply is visible."""

    types = None

    def __init__(self, name: str = "effects") -> None:
        self.name = name

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        await tx.conn.execute(
            "INSERT INTO effects (consumer, event_id, position) VALUES ($1, $2, $3)",
            self.name,
            event.event_id,
            event.position,
        )


async def effect_counts(store: EventStore, consumer: str = "effects") -> dict[int, int]:
    """Position -> number of times ``consumer`` applied it."""
    rows = await store.fetch(
        "SELECT position, count(*) AS n FROM effects WHERE consumer = $1 GROUP BY position",
        consumer,
    )
    return {r["position"]: r["n"] for r in rows}


def create_database(pg_server: ServerProcess, prefix: str = "t") -> str:
    """Creates a fresh, empty database on ``pg_server`` (from sync code) and returns its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"

    async def create() -> None:
        conn = await asyncpg.connect(pg_server.url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return pg_server.url.rsplit("/", 1)[0] + f"/{name}"


def cli_env(
    monkeypatch: Any, home: Path, url: str, user: str = "admin", password: str = ADMIN_PASSWORD
) -> None:
    """Points the in-process CLI at the API ``url`` as ``user`` with a fresh ``home`` (none of
    the caller's ``CAIRN_USER``/``CAIRN_PASSWORD``/``CAIRN_MASTER``/``CAIRN_HOME`` leaks in)."""
    for name in ("CAIRN_USER", "CAIRN_PASSWORD", "CAIRN_MASTER", "CAIRN_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CAIRN_HOME", str(home))
    monkeypatch.setenv("CAIRN_MASTER", url)
    monkeypatch.setenv("CAIRN_USER", user)
    monkeypatch.setenv("CAIRN_PASSWORD", password)
