"""The store tells its observers each append's time and size, and reads every consumer's lag in
one statement, as the metrics need them."""

from __future__ import annotations

from events.domain.types import ExperimentSubmitted
from events.log import append_timing
from events.log.store import EventStore


async def test_an_append_reports_its_time_and_events_to_observers(store: EventStore) -> None:
    """Each successful append (alone or in a transaction) calls every observer once with its
    statement time and event count; a failing observer fails no append; an unwatched one hears
    nothing more."""
    heard: list[tuple[float, int]] = []

    def broken(seconds: float, events: int) -> None:
        raise RuntimeError("an observer that fails")

    stop = append_timing.watch(lambda seconds, events: heard.append((seconds, events)))
    stop_broken = append_timing.watch(broken)
    try:
        await store.append(
            "experiment-1",
            [
                ExperimentSubmitted(experiment_id=1, config={}),
                ExperimentSubmitted(experiment_id=1, config={}),
            ],
        )
        async with store.transaction() as tx:
            await tx.append("experiment-2", [ExperimentSubmitted(experiment_id=2, config={})])
    finally:
        stop()
        stop_broken()
    await store.append("experiment-3", [ExperimentSubmitted(experiment_id=3, config={})])
    assert [events for _, events in heard] == [2, 1]
    assert all(seconds > 0 for seconds, _ in heard)


async def test_consumer_positions_give_the_head_and_every_checkpoint(store: EventStore) -> None:
    """The head and each consumer's checkpoint come from one read; an empty log's head is 0."""
    assert await store.consumer_positions() == (0, {})
    for n in range(3):
        await store.append(f"experiment-{n}", [ExperimentSubmitted(experiment_id=n, config={})])
    head = await store.head()
    async with store.transaction() as tx:
        await tx.lock_checkpoint("slow")
        await tx.set_checkpoint("slow", head - 2)
    assert await store.consumer_positions() == (head, {"slow": head - 2})
