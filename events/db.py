"""PostgreSQL connections: pools, JSON codecs, and the one place driver errors are translated."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any, TypeAlias, cast

import asyncpg

from events.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventsError,
    StoreUnavailableError,
)

Pool: TypeAlias = asyncpg.Pool
Connection: TypeAlias = asyncpg.Connection

EVENT_ID_CONSTRAINT = "events_event_id_key"
_KEY_VALUE = re.compile(r"\(event_id\)=\(([^)]*)\)")


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name, encoder=_dumps, decoder=json.loads, schema="pg_catalog", format="text"
        )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Resets nothing when a connection goes back to the pool (asyncpg still rolls back an open
    transaction). The default reset costs a round trip per use, and pool sessions hold no
    state to reset: no session advisory locks, LISTENs, cursors or SETs outside a transaction
    (leases and listeners use connections of their own, from :func:`connect`)."""


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


async def create_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 10, settings: dict[str, str] | None = None
) -> Pool:
    """Opens a connection pool whose connections decode json/jsonb to Python values.

    Args:
        dsn: where to connect.
        min_size: connections opened at once.
        max_size: the most connections open.
        settings: server settings for the pool's sessions.
    """
    with translate_errors():
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=_init_connection,
            reset=_keep_session,
            server_settings=settings,
        )
    assert pool is not None
    return cast(Pool, pool)


async def connect(dsn: str, *, settings: dict[str, str] | None = None) -> Connection:
    """Opens one dedicated connection (for leases and LISTEN), with the same codecs as a pool.

    Args:
        dsn: where to connect.
        settings: server settings for this session only (e.g. ``idle_session_timeout``).
    """
    with translate_errors():
        conn = await asyncpg.connect(dsn, server_settings=settings)
        await _init_connection(conn)
    return cast(Connection, conn)


@contextlib.contextmanager
def translate_errors(stream_id: str | None = None) -> Iterator[None]:
    """Turns asyncpg and socket errors into :mod:`events.errors` errors.

    Args:
        stream_id: the stream being appended to, named in the errors it explains.

    Raises:
        ConcurrencyError: two appends raced for the same stream version.
        DuplicateEventError: an append reused an ``event_id`` already in the log.
        StoreUnavailableError: the database is unreachable or busy (or another unique key).
    """
    try:
        yield
    except EventsError:
        raise
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == "events_pkey" and stream_id is not None:
            raise ConcurrencyError(stream_id, None, -1) from exc
        if exc.constraint_name == EVENT_ID_CONSTRAINT:
            found = _KEY_VALUE.search(getattr(exc, "detail", None) or "")
            raise DuplicateEventError(stream_id, found.group(1) if found else None) from exc
        raise StoreUnavailableError(f"unique violation: {exc}") from exc
    except asyncpg.LockNotAvailableError as exc:
        raise StoreUnavailableError(f"event log busy: {exc}") from exc
    except (
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
        asyncpg.AdminShutdownError,
        asyncpg.CannotConnectNowError,
        ConnectionError,
        OSError,
    ) as exc:
        raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
