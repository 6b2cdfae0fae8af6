"""PostgreSQL connections: pools, JSON codecs, and the one place driver errors are translated.

Every connection this module hands out (from :func:`create_pool` or :func:`connect`) is a
:class:`TranslatingConnection`: each query method turns asyncpg and socket errors into
:mod:`events.log.errors` errors, and so does opening a connection, whether directly or when a pool
grows, taking one from a pool (:func:`acquire`) and iterating a cursor (:func:`translated`).
Callers therefore never see a driver error, whatever query they run; no other module translates.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterator
from typing import Any, TypeAlias, cast

import asyncpg
import msgspec

from events.log.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventsError,
    StatementError,
    StoreUnavailableError,
)

EVENT_ID_CONSTRAINT = "events_event_id_key"
_KEY_VALUE = re.compile(r"\(event_id\)=\(([^)]*)\)")
_STREAM_KEY = re.compile(r"\(stream_id, stream_version\)=\((.*), (-?\d+)\)")


class TranslatingConnection(asyncpg.Connection):  # type: ignore[misc]
    """An asyncpg connection whose query methods raise :mod:`events.log.errors` errors only.

    ``transaction()`` needs no override: its BEGIN, COMMIT and ROLLBACK go through
    :meth:`execute`.
    """

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        """``asyncpg.Connection.execute`` with errors translated."""
        with translate_errors():
            return await super().execute(*args, **kwargs)

    async def executemany(self, *args: Any, **kwargs: Any) -> Any:
        """``asyncpg.Connection.executemany`` with errors translated."""
        with translate_errors():
            return await super().executemany(*args, **kwargs)

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        """``asyncpg.Connection.fetch`` with errors translated."""
        with translate_errors():
            return await super().fetch(*args, **kwargs)

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        """``asyncpg.Connection.fetchrow`` with errors translated."""
        with translate_errors():
            return await super().fetchrow(*args, **kwargs)

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        """``asyncpg.Connection.fetchval`` with errors translated."""
        with translate_errors():
            return await super().fetchval(*args, **kwargs)

    async def copy_records_to_table(self, *args: Any, **kwargs: Any) -> Any:
        """``asyncpg.Connection.copy_records_to_table`` with errors translated."""
        with translate_errors():
            return await super().copy_records_to_table(*args, **kwargs)


Pool: TypeAlias = asyncpg.Pool
Connection: TypeAlias = TranslatingConnection


_DECODER = msgspec.json.Decoder()
"""msgspec's untyped JSON decoder: exact integers of any size, like the standard parser."""


async def _init_connection(conn: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await conn.set_type_codec(
            name, encoder=_dumps, decoder=loads, schema="pg_catalog", format="text"
        )


def loads(text: str) -> Any:
    """Parses JSON read from the database exactly as :func:`json.loads` would, only faster.

    Replay spends much of its time here. msgspec parses integers of any size exactly, as the
    standard parser does; what it refuses (a number beyond a double's range, which the
    standard parser reads as infinity) goes to the standard parser.
    """
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


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
            connect=_connect_translated,
            connection_class=TranslatingConnection,
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
    conn = await _connect_translated(
        dsn, connection_class=TranslatingConnection, server_settings=settings
    )
    await _init_connection(conn)
    return cast(Connection, conn)


@contextlib.asynccontextmanager
async def acquire(pool: Pool) -> AsyncIterator[Connection]:
    """A connection from ``pool`` for the block; taking it, and anything the block raises from
    the driver, comes out as an :mod:`events.log.errors` error."""
    with translate_errors():
        async with pool.acquire() as conn:
            yield cast(Connection, conn)


async def translated(rows: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """Iterates ``rows`` (a cursor: its fetches bypass the connection's query methods) with
    driver errors translated."""
    with translate_errors():
        async for row in rows:
            yield row


async def _connect_translated(*args: Any, **kwargs: Any) -> Any:
    """``asyncpg.connect`` with errors translated; a pool uses it to open each connection."""
    with translate_errors():
        return await asyncpg.connect(*args, **kwargs)


@contextlib.contextmanager
def translate_errors(stream_id: str | None = None) -> Iterator[None]:
    """Turns asyncpg and socket errors into :mod:`events.log.errors` errors.

    Args:
        stream_id: the stream being appended to, named in the errors it explains.

    Raises:
        ConcurrencyError: two appends raced for the same stream version.
        DuplicateEventError: an append reused an ``event_id`` already in the log.
        StoreUnavailableError: the database is unreachable or busy; a retry may succeed.
        StatementError: the database refused the statement; a retry cannot succeed.
    """
    try:
        yield
    except DuplicateEventError as exc:
        if stream_id is None or exc.stream_id is not None:
            raise
        raise DuplicateEventError(stream_id, exc.event_id) from exc.__cause__
    except EventsError:
        raise
    except asyncpg.UniqueViolationError as exc:
        if exc.constraint_name == "events_pkey":
            key = _STREAM_KEY.search(getattr(exc, "detail", None) or "")
            if stream_id is not None or key is not None:
                raise ConcurrencyError(
                    stream_id or (key.group(1) if key else ""), None, -1
                ) from exc
        if exc.constraint_name == EVENT_ID_CONSTRAINT:
            found = _KEY_VALUE.search(getattr(exc, "detail", None) or "")
            raise DuplicateEventError(stream_id, found.group(1) if found else None) from exc
        raise _refused(exc) from exc
    except asyncpg.LockNotAvailableError as exc:
        raise StoreUnavailableError(f"event log busy: {exc}") from exc
    except (
        asyncpg.TransactionRollbackError,  # serialization failure, deadlock: retry the transaction
        asyncpg.InsufficientResourcesError,  # too many connections, disk full
        asyncpg.QueryCanceledError,
    ) as exc:
        raise StoreUnavailableError(
            f"PostgreSQL could not complete the statement now: {exc}"
        ) from exc
    except (
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
        asyncpg.AdminShutdownError,
        asyncpg.CannotConnectNowError,
        ConnectionError,
        OSError,
    ) as exc:
        raise StoreUnavailableError(f"PostgreSQL unavailable: {exc}") from exc
    except asyncpg.PostgresError as exc:
        raise _refused(exc) from exc


def _refused(exc: asyncpg.PostgresError) -> StatementError:
    return StatementError(
        f"the database refused a statement: {exc}",
        getattr(exc, "sqlstate", None),
        getattr(exc, "constraint_name", None),
    )
