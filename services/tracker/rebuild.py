"""Rebuilding one of the tracker's projections from position 0 of the log."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from events.log.consumer import Consumer
from events.log.store import EventStore, Transaction


async def rebuild_consumer(
    store: EventStore,
    consumer: Consumer,
    tables: Sequence[str],
    *,
    batch: int = 5000,
    finish: Callable[[Transaction], Awaitable[None]] | None = None,
) -> int:
    """Truncates ``tables``, replays the log to its head through ``consumer.handle_page`` and
    moves the consumer's checkpoint to that head.

    Everything happens in one transaction holding the consumer's checkpoint lock, so a live
    consumer waits and readers never see half-built tables. Its statements are planned for
    their parameters every time: a generic plan, cached while the truncated tables were empty
    (no ANALYZE can happen inside the transaction), would scan them in full on every page as
    they fill, which made a rebuild quadratic in the log's length.

    Args:
        store: the event store.
        consumer: the projection's consumer (its ``name`` and ``types`` are used).
        tables: the tables it owns, emptied first.
        batch: events read per page.
        finish: run after the last page, before the checkpoint moves, in the transaction.

    Returns:
        How many events were applied.
    """
    applied = 0
    async with store.transaction() as tx:
        await tx.lock_checkpoint(consumer.name)
        await tx.conn.execute(f"TRUNCATE {', '.join(tables)}")
        await tx.conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        head = await tx.head()
        position = 0
        while position < head:
            events = await tx.read_all(position, upto=head, limit=batch, types=consumer.types)
            await consumer.handle_page(tx, events)
            applied += len(events)
            if len(events) < batch:
                break
            position = events[-1].position
        if finish is not None:
            await finish(tx)
        await tx.set_checkpoint(consumer.name, head)
    return applied
