"""Idempotent intake for the gateway's routes: claims in the log's ``inbox`` (through
:mod:`events.log.inbox`, which owns it) and transactions re-run on a concurrent append."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from events.log.errors import ConcurrencyError
from events.log.inbox import claim, claim_many, record
from events.log.store import EventStore, Transaction

__all__ = ["claim", "claim_many", "in_transaction", "record"]

T = TypeVar("T")


async def in_transaction(
    store: EventStore, work: Callable[[Transaction], Awaitable[T]], *, attempts: int = 8
) -> T:
    """Runs ``work`` in a transaction, re-running it from scratch on a :class:`ConcurrencyError`.

    ``work`` folds what it needs inside the transaction and appends with the version it read,
    so a concurrent writer makes it re-fold and re-decide rather than act on stale state.
    """
    for attempt in range(attempts):
        try:
            async with store.transaction() as tx:
                return await work(tx)
        except ConcurrencyError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.005 * (attempt + 1))
    raise AssertionError("unreachable")
