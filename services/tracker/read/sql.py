"""The SQL helpers of the tracker's read queries: rows as dicts, counts and paged filters, each
answering as if the tables were empty while the tracker has not created them."""

from __future__ import annotations

from typing import Any

from events.log.db import Connection
from events.log.errors import StatementError


async def fetch_rows(conn: Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    """The rows of a query as dicts; none while the tracker has not created its tables."""
    try:
        return [dict(r) for r in await conn.fetch(sql, *args)]
    except StatementError as exc:
        if exc.undefined_table:
            return []
        raise


async def fetch_count(conn: Connection, sql: str, *args: Any) -> int:
    """The single value of a one-row count query (0 while the tables do not exist)."""
    found = await fetch_rows(conn, sql, *args)
    return int(next(iter(found[0].values()))) if found else 0


class Where:
    """A conjunction of SQL conditions with numbered parameters."""

    def __init__(self) -> None:
        self.conditions: list[str] = []
        self.args: list[Any] = []

    def add(self, condition: str, *values: Any) -> None:
        """Adds ``condition``, where ``{}`` placeholders become the next parameter numbers."""
        numbers = []
        for value in values:
            self.args.append(value)
            numbers.append(f"${len(self.args)}")
        self.conditions.append(condition.format(*numbers))

    def sql(self) -> str:
        """``WHERE ...`` (or nothing)."""
        return "WHERE " + " AND ".join(self.conditions) if self.conditions else ""

    async def page(
        self, conn: Connection, columns: str, table: str, order: str, limit: int | None, offset: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The matching rows of ``table`` in ``order``, one page of them, and how many match."""
        total = await fetch_count(conn, f"SELECT count(*) FROM {table} {self.sql()}", *self.args)
        lim, off = f"${len(self.args) + 1}", f"${len(self.args) + 2}"
        found = await fetch_rows(
            conn,
            f"SELECT {columns} FROM {table} {self.sql()} ORDER BY {order} LIMIT {lim} OFFSET {off}",
            *self.args,
            limit,
            offset,
        )
        return found, total
