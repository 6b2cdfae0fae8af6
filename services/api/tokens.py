"""User tokens (table ``api_tokens``): their lifetime, listing and revocation.

A token from ``POST /auth/login`` is valid until its ``expires_at`` (the cluster config's
``accounts.token_lifetime`` after the login); tokens issued before tokens expired get that
lifetime from their creation when the gateway starts. A token is listed and revoked by its
``id``, never by the token or its hash.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from events.log.store import EventStore
from services.api.auth import hash_token


async def bound_lifetimes(store: EventStore, lifetime: timedelta) -> int:
    """Gives every token without an expiry one (``created_at + lifetime``) and removes the
    expired ones; returns how many were given one."""
    result = await store.execute(
        "UPDATE api_tokens SET expires_at = created_at + $1::interval WHERE expires_at IS NULL",
        lifetime,
    )
    await store.execute("DELETE FROM api_tokens WHERE expires_at <= now()")
    return int(str(result).rsplit(" ", 1)[-1] or 0)


def _row(row: Any, current_hash: str | None) -> dict[str, Any]:
    return {
        "id": int(row["id"]),
        "username": str(row["username"]),
        "created_at": row["created_at"].isoformat(),
        "expires_at": row["expires_at"].isoformat() if row["expires_at"] else None,
        "current": row["token_hash"] == current_hash,
    }


async def list_tokens(
    store: EventStore, *, username: str | None, current: str | None
) -> list[dict[str, Any]]:
    """The valid tokens of ``username`` (``None``: everyone's), newest first.

    Args:
        store: the event store (its pool holds the gateway's tables).
        username: whose tokens; ``None`` for every user's.
        current: the caller's own token, marked ``current``.

    Returns:
        ``{"id", "username", "created_at", "expires_at", "current"}`` per token.
    """
    rows = await store.fetch(
        """SELECT id, username, token_hash, created_at, expires_at FROM api_tokens
           WHERE ($1::text IS NULL OR username = $1)
             AND (expires_at IS NULL OR expires_at > now())
           ORDER BY created_at DESC, id DESC""",
        username,
    )
    current_hash = hash_token(current) if current else None
    return [_row(r, current_hash) for r in rows]


async def owner_of(store: EventStore, token_id: int) -> str | None:
    """The username token ``token_id`` belongs to, or ``None`` when there is none (expired
    ones included)."""
    owner = await store.fetchval(
        "SELECT username FROM api_tokens WHERE id = $1 AND (expires_at IS NULL "
        "OR expires_at > now())",
        token_id,
    )
    return None if owner is None else str(owner)


async def revoke(store: EventStore, token_id: int) -> bool:
    """Revokes token ``token_id``; returns whether there was one."""
    gone = await store.fetchval("DELETE FROM api_tokens WHERE id = $1 RETURNING 1", token_id)
    return gone is not None
