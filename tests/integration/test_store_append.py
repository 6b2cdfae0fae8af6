"""The one-statement append: its checks refuse whole, store nothing and wake nobody."""

from __future__ import annotations

from typing import Any

import pytest

from events.domain.types import ExperimentSubmitted
from events.log.db import connect
from events.log.errors import ConcurrencyError, FencedError
from events.log.lease import LeaderLease
from events.log.store import NOTIFY_CHANNEL, EventStore, Fence
from tests.helpers import wait_until


def submitted(i: int) -> ExperimentSubmitted:
    return ExperimentSubmitted(experiment_id=i, config={"i": i})


async def test_refused_appends_store_nothing_and_wake_nobody(store: EventStore) -> None:
    """A stale expected version or a stale fence stores nothing and sends no wake-up, although
    a single append commits on its own; the next good append wakes listeners once."""
    heard: list[str] = []
    listener = await connect(store.dsn)

    def note(*args: Any) -> None:
        heard.append(args[3])

    await listener.add_listener(NOTIFY_CHANNEL, note)
    try:
        first = await LeaderLease.acquire(store, "appender")
        assert first is not None
        await first.release()
        second = await LeaderLease.acquire(store, "appender")
        assert second is not None
        await wait_until(lambda: len(heard) == 2)  # the two elections
        heard.clear()

        await store.append("experiment-1", [submitted(1)], expected_version=0)
        with pytest.raises(ConcurrencyError) as err:
            await store.append("experiment-1", [submitted(2)], expected_version=0)
        assert (err.value.expected, err.value.actual) == (0, 1)
        with pytest.raises(FencedError):
            await store.append("experiment-2", [submitted(3)], fence=Fence("appender", first.epoch))
        await store.append("experiment-3", [submitted(4)], fence=second.fence)
        # Wake-ups arrive in commit order: a refused append's would come before the last one.
        await wait_until(lambda: "experiment-3" in heard)
        assert heard == ["experiment-1", "experiment-3"]
        assert [e.stream_id for e in await store.read_all(types=["ExperimentSubmitted"])] == [
            "experiment-1",
            "experiment-3",
        ]
        await second.release()
    finally:
        await listener.close()


async def test_fence_is_checked_inside_a_transaction(store: EventStore) -> None:
    """In a transaction, an append carrying a stale fence is refused and the transaction's
    earlier appends are rolled back with it; the current fence is stamped on each event."""
    first = await LeaderLease.acquire(store, "tx-lease")
    assert first is not None
    await first.release()
    second = await LeaderLease.acquire(store, "tx-lease")
    assert second is not None
    with pytest.raises(FencedError):
        async with store.transaction() as tx:
            await tx.append("experiment-8", [submitted(8)])
            await tx.append("experiment-9", [submitted(9)], fence=Fence("tx-lease", first.epoch))
    assert await store.read_stream("experiment-8") == []
    async with store.transaction() as tx:
        tx.write_as(second.fence)
        await tx.append("experiment-8", [submitted(8)])
        await tx.append("experiment-8", [submitted(10)], expected_version=1)
    stamped = [e.metadata.epoch for e in await store.read_stream("experiment-8")]
    assert stamped == [second.epoch, second.epoch]
    await second.release()


async def test_appended_events_equal_the_log_read_back(store: EventStore) -> None:
    """What an append returns (built without validation) equals what a read of the log gives,
    field for field, for a single append and for a batch in a transaction."""
    single = await store.append("experiment-11", [submitted(11)], expected_version=0)
    async with store.transaction() as tx:
        batch = await tx.append("experiment-11", [submitted(12), submitted(13)], expected_version=1)
    read = await store.read_stream("experiment-11")
    assert [*single, *batch] == read
    assert [e.model_fields_set for e in [*single, *batch]] == [e.model_fields_set for e in read]
    assert [e.model_dump() for e in [*single, *batch]] == [e.model_dump() for e in read]
