"""Idempotent intake: the ``inbox`` table records each (source, key) once, in the same
transaction as the effect, so a repeated request is a no-op that returns the first answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from events.log.store import Transaction


async def claim(tx: Transaction, source: str, key: str) -> tuple[bool, Any]:
    """Claims ``(source, key)`` in ``tx``.

    Returns:
        ``(True, None)`` when the key is new (the caller performs the effect), or
        ``(False, result)`` with the result recorded by the first claim.
    """
    new = await tx.conn.fetchval(
        "INSERT INTO inbox (source, key) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING true",
        source,
        key,
    )
    if new:
        return True, None
    result = await tx.conn.fetchval(
        "SELECT result FROM inbox WHERE source = $1 AND key = $2", source, key
    )
    return False, result


async def claim_many(tx: Transaction, source: str, keys: Sequence[str]) -> set[str]:
    """Claims many keys of ``source`` in one statement; returns the ones that were new."""
    rows = await tx.conn.fetch(
        """INSERT INTO inbox (source, key) SELECT $1, k FROM unnest($2::text[]) AS u(k)
           ON CONFLICT DO NOTHING RETURNING key""",
        source,
        list(keys),
    )
    return {str(r["key"]) for r in rows}


async def record(tx: Transaction, source: str, key: str, result: Any) -> None:
    """Stores the answer to a claimed key, returned to later duplicates."""
    await tx.conn.execute(
        "UPDATE inbox SET result = $3::jsonb WHERE source = $1 AND key = $2", source, key, result
    )
