"""The event store against a real PostgreSQL: concurrency, ordering, reads."""

from __future__ import annotations

import asyncio

import pytest

from events.domain.types import ExperimentSubmitted, TrialRequested
from events.log.envelope import NewEvent, RecordedEvent
from events.log.errors import ConcurrencyError, DuplicateEventError, EventTooLargeError, FencedError
from events.log.lease import LeaderLease
from events.log.limits import MAX_EVENT_BYTES, encoded
from events.log.store import EventStore, Fence, lease_stream
from tests.helpers import wait_until


def submitted(i: int) -> ExperimentSubmitted:
    return ExperimentSubmitted(experiment_id=i, config={"i": i})


def requested(exp: int, n: int) -> TrialRequested:
    return TrialRequested(
        experiment_id=exp,
        trial_id=exp * 100_000 + n,
        seq=n,
        request_id=f"r{n}",
        hparams={"n": n},
        trial_seed=n,
    )


async def test_conflicting_expected_version_raises(store: EventStore) -> None:
    """A second append at an already-taken expected version fails with ConcurrencyError."""
    await store.append("experiment-1", [submitted(1)], expected_version=0)
    with pytest.raises(ConcurrencyError) as err:
        await store.append("experiment-1", [requested(1, 1)], expected_version=0)
    assert err.value.actual == 1
    assert [e.type for e in await store.read_stream("experiment-1")] == ["ExperimentSubmitted"]


async def test_racing_appends_at_same_version_one_wins(store: EventStore) -> None:
    """Of ten concurrent appends expecting the same version, exactly one commits."""
    await store.append("experiment-2", [submitted(2)], expected_version=0)

    async def attempt(n: int) -> bool:
        try:
            await store.append("experiment-2", [requested(2, n)], expected_version=1)
            return True
        except ConcurrencyError:
            return False

    results = await asyncio.gather(*(attempt(n) for n in range(10)))
    assert sum(results) == 1
    assert await store.stream_version("experiment-2") == 2


async def test_racing_writers_never_interleave_and_tail_sees_each_once(db_url: str) -> None:
    """Two writers' large batches get contiguous positions; a concurrent tail sees every event once."""
    writers = [await EventStore.connect(db_url) for _ in range(2)]
    reader = await EventStore.connect(db_url)
    batches, size = 15, 200
    done = asyncio.Event()
    seen: list[RecordedEvent] = []

    async def write(w: int) -> list[list[int]]:
        blocks = []
        for b in range(batches):
            events = [requested(w, b * size + i) for i in range(size)]
            recorded = await writers[w].append(f"trial-{w}.{b}", events)
            blocks.append([e.position for e in recorded])
        return blocks

    async def tail() -> None:
        after = 0
        while True:
            finished = done.is_set()
            page = await reader.read_all(after, limit=700)
            seen.extend(page)
            if page:
                after = page[-1].position
            elif finished:
                return
            else:
                await asyncio.sleep(0.001)  # the tailing reader's poll: part of the scenario

    tailer = asyncio.create_task(tail())
    blocks = await asyncio.gather(write(0), write(1))
    done.set()
    await tailer
    for block in [b for w in blocks for b in w]:
        assert block == list(range(block[0], block[0] + size)), "a batch was interleaved"
    everything = await reader.read_all(0, limit=10_000)
    assert len(everything) == 2 * batches * size
    assert [e.event_id for e in seen] == [e.event_id for e in everything]
    for s in [*writers, reader]:
        await s.close()


async def test_read_all_filters_by_type_and_bounds(store: EventStore) -> None:
    """read_all honours after/upto bounds and the type filter, in position order."""
    await store.append("experiment-3", [submitted(3), requested(3, 1), requested(3, 2)])
    all_events = await store.read_all()
    only = await store.read_all(types=["TrialRequested"])
    assert [e.type for e in only] == ["TrialRequested", "TrialRequested"]
    bounded = await store.read_all(all_events[0].position, upto=all_events[1].position)
    assert [e.position for e in bounded] == [all_events[1].position]
    assert await store.head() == all_events[-1].position


async def test_stale_fence_is_rejected(store: EventStore) -> None:
    """After a newer leader is elected, a write carrying the older epoch raises FencedError."""
    first = await LeaderLease.acquire(store, "demo")
    assert first is not None
    await store.append("experiment-5", [submitted(5)], fence=first.fence)
    await first.release()
    second = await LeaderLease.acquire(store, "demo")
    assert second is not None and second.epoch == first.epoch + 1
    with pytest.raises(FencedError):
        await store.append("experiment-5", [requested(5, 1)], fence=Fence("demo", first.epoch))
    await store.append("experiment-5", [requested(5, 1)], fence=second.fence)
    recorded = await store.read_stream("experiment-5")
    assert recorded[-1].metadata.epoch == second.epoch
    await second.release()


# A session waiting in pg_advisory_lock for a lock another session holds.
WAITING_FOR_LOCK = """SELECT count(*) > 0 FROM pg_locks
    WHERE locktype = 'advisory' AND NOT granted AND database = (
        SELECT oid FROM pg_database WHERE datname = current_database())"""


async def test_second_lease_holder_waits_until_first_releases(store: EventStore) -> None:
    """A second process asking for a held lease gets it only after the holder lets go."""
    first = await LeaderLease.acquire(store, "relay-x")
    assert first is not None
    waiter = asyncio.create_task(LeaderLease.acquire(store, "relay-x"))
    await wait_until(lambda: store.fetchval(WAITING_FOR_LOCK))
    assert not waiter.done()
    assert len(await store.read_stream(lease_stream("relay-x"))) == 1, "only the holder was elected"
    await first.release()
    second = await asyncio.wait_for(waiter, 10)
    assert second is not None and second.epoch == first.epoch + 1
    await second.release()


async def test_event_ids_are_unique(store: EventStore) -> None:
    """Re-appending an already-stored event id raises DuplicateEventError naming the stream and
    id (not a retryable StoreUnavailableError), in this stream or another; nothing is stored."""
    item = NewEvent(event=submitted(6))
    await store.append("experiment-6", [item])
    for stream in ("experiment-6", "experiment-7"):
        with pytest.raises(DuplicateEventError) as err:
            await store.append(stream, [NewEvent(event=submitted(7)), item])
        assert (err.value.stream_id, err.value.event_id) == (stream, str(item.event_id))
    assert len(await store.read_stream("experiment-6")) == 1
    assert await store.read_stream("experiment-7") == []


async def test_event_over_the_size_limit_is_refused_whole(store: EventStore) -> None:
    """An append whose event is over the limit raises EventTooLargeError naming the stream,
    type, size and largest part, and nothing of the batch is stored; one byte less is stored."""
    big = ExperimentSubmitted(experiment_id=3, config={"description": "é" * MAX_EVENT_BYTES})
    with pytest.raises(EventTooLargeError) as err:
        await store.append("experiment-3", [submitted(3), big])
    error = err.value
    assert (error.stream_id, error.event_type) == ("experiment-3", "ExperimentSubmitted")
    assert error.size > error.limit == MAX_EVENT_BYTES
    assert error.part == "config.description" and error.part_size > MAX_EVENT_BYTES
    assert "experiment-3" in str(error) and "config.description" in str(error)
    assert await store.read_stream("experiment-3") == []
    empty = ExperimentSubmitted(experiment_id=3, config={"i": ""}).model_dump(mode="json")
    room = MAX_EVENT_BYTES - len(encoded(empty)) - len(b"{}")  # "{}": no metadata
    with pytest.raises(EventTooLargeError):
        await store.append(
            "experiment-3", [ExperimentSubmitted(experiment_id=3, config={"i": "x" * (room + 1)})]
        )
    await store.append(
        "experiment-3", [ExperimentSubmitted(experiment_id=3, config={"i": "x" * room})]
    )
    assert len(await store.read_stream("experiment-3")) == 1
