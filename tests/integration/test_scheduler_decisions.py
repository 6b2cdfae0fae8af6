"""The scheduler decides each thing once over a real log: it plans only on a state that holds its
own earlier decisions, and a plan overtaken by another writer loses and is made again."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from events.domain.types import (
    AgentRegistered,
    ExperimentSubmitted,
    TrialExited,
    TrialKillRequested,
    TrialRequested,
    TrialStarted,
    WorkloadCompleted,
)
from events.domain.types.agent import Slot
from events.log.consumer import ConsumerRunner
from events.log.envelope import Event
from events.log.errors import ConcurrencyError
from events.log.store import EventStore, Transaction
from services.scheduler.planner import Settings
from services.scheduler.service import SchedulerConsumer
from services.scheduler.state import STREAMS, TYPES, ClusterState

CONFIG: dict[str, Any] = {
    "name": "race",
    "entrypoint": "python3 train.py",
    "searcher": {"name": "single", "metric": "loss"},
    "resources": {"slots_per_trial": 1},
}


async def seed(store: EventStore, trials: int, slots: int) -> int:
    """One experiment with ``trials`` requested trials and one agent with ``slots`` slots;
    returns the head of the log."""
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=CONFIG)])
    await store.append(
        "agent-a",
        [AgentRegistered(agent_id="a", slots=[Slot(slot_id=f"s{i}") for i in range(slots)])],
    )
    await store.append(
        "experiment-1",
        [
            TrialRequested(
                experiment_id=1,
                trial_id=10 + n,
                seq=n,
                request_id=f"r{n}",
                hparams={},
                trial_seed=n,
            )
            for n in range(1, trials + 1)
        ],
    )
    return await store.head()


async def allocations(store: EventStore) -> list[dict[str, Any]]:
    """Every ``SlotsAllocated`` payload, in log order."""
    return [e.payload for e in await store.read_all(limit=100_000, types=["SlotsAllocated"])]


def assert_each_decided_once(allocated: list[dict[str, Any]]) -> None:
    """No allocation id twice, no slot in two allocations (none is released in these tests)."""
    per_id = Counter(a["allocation_id"] for a in allocated)
    assert [i for i, n in per_id.items() if n > 1] == [], f"allocated twice: {per_id}"
    per_slot = Counter(
        (agent, slot)
        for a in allocated
        for agent, slots in a["placements"].items()
        for slot in slots
    )
    assert [s for s, n in per_slot.items() if n > 1] == [], f"slot held twice: {per_slot}"


async def test_wake_up_below_its_own_decisions_decides_nothing_again(store: EventStore) -> None:
    """A bus wake-up at a position inside the scheduler's own last decisions plans on the head,
    not on a state missing some of them, so nothing is allocated twice."""
    head = await seed(store, trials=4, slots=4)
    runner = ConsumerRunner(store, None, SchedulerConsumer(store, Settings()))
    await runner.catch_up()
    first = await allocations(store)
    assert len(first) == 4, "the first round allocated every trial"
    assert await store.head() > head + 1, "the round appended several decisions after the head"

    # The relay's wake-up for the first of those decisions: positions (head, head + 1].
    await runner.catch_up(upto=head + 1)
    await runner.catch_up()

    allocated = await allocations(store)
    assert_each_decided_once(allocated)
    assert len(allocated) == 4


async def test_wake_ups_at_every_position_decide_each_allocation_once(store: EventStore) -> None:
    """Wake-ups at every position of the log, in order and repeated, never repeat a decision."""
    await seed(store, trials=6, slots=3)
    runner = ConsumerRunner(store, None, SchedulerConsumer(store, Settings()))
    await runner.catch_up()
    for position in range(1, await store.head() + 1):
        await runner.catch_up(upto=position)
        await runner.catch_up(upto=position)
    allocated = await allocations(store)
    assert_each_decided_once(allocated)
    assert len(allocated) == 3, "three slots, three allocations; the rest wait"


class Overtaken(SchedulerConsumer):
    """A scheduler whose first plan is overtaken: just before its first append, another writer
    commits (through ``overtake``) on a stream the plan decides on."""

    def __init__(self, store: EventStore, overtake: Any) -> None:
        super().__init__(store, Settings())
        self.overtake = overtake
        self.plans: list[ClusterState] = []

    async def before_commit(self, tx: Transaction) -> None:
        self.plans.append(self.state)
        if self.overtake is not None:
            overtake, self.overtake = self.overtake, None
            await overtake()
        await super().before_commit(tx)


async def test_stale_plan_of_a_second_scheduler_loses_and_replans_once(store: EventStore) -> None:
    """Two schedulers plan on the same log; the one whose plan went stale before its append
    loses with ConcurrencyError, re-plans on the other's decisions and allocates nothing twice."""
    await seed(store, trials=2, slots=2)
    other = ConsumerRunner(store, None, SchedulerConsumer(store, Settings()), max_replans=0)
    other.consumer.name = "scheduler-other"
    slow = Overtaken(store, other.catch_up)
    runner = ConsumerRunner(store, None, slow)

    await runner.catch_up()

    assert runner.replans == 1, "the first plan lost the race"
    assert len(slow.plans) == 2, "and was made again on a fresh read"
    allocated = await allocations(store)
    assert_each_decided_once(allocated)
    assert len(allocated) == 2
    assert slow.decided == 0, "the re-plan found every trial already allocated"


async def test_lost_race_keeps_the_folded_state_instead_of_refolding(store: EventStore) -> None:
    """After a lost race the scheduler keeps its state (the page's events are facts all the
    same; only its decisions were rolled back), skips them when the page is read again, and
    ends in the state a fresh fold of the whole log reaches."""
    await seed(store, trials=2, slots=2)
    other = ConsumerRunner(store, None, SchedulerConsumer(store, Settings()), max_replans=0)
    other.consumer.name = "scheduler-other"
    slow = Overtaken(store, other.catch_up)
    state = slow.state
    runner = ConsumerRunner(store, None, slow)

    await runner.catch_up()

    assert runner.replans == 1 and slow.races == 1, "the plan lost a race"
    assert slow.state is state, "the state was kept, not rebuilt from position 0"
    fresh = ClusterState()
    async for event in store.iter_all(0, types=TYPES, envelopes=STREAMS):
        fresh.apply(event)
    assert (slow.state.experiments, slow.state.trials, slow.state.agents) == (
        fresh.experiments,
        fresh.trials,
        fresh.agents,
    )
    assert slow.state.versions == fresh.versions


async def test_user_kill_before_the_append_wins_over_a_stale_allocation(store: EventStore) -> None:
    """A user's kill committed between the scheduler's read and its append makes the allocation
    plan lose; the re-plan cancels the trial instead of giving it slots."""
    await seed(store, trials=2, slots=2)

    async def kill() -> None:
        await store.append("trial-11", [TrialKillRequested(trial_id=11)])

    slow = Overtaken(store, kill)
    runner = ConsumerRunner(store, None, slow)
    await runner.catch_up()

    assert runner.replans == 1, "the plan made before the kill lost"
    allocated = await allocations(store)
    assert [a["trial_id"] for a in allocated] == [12]
    states = [
        (e.payload["trial_id"], e.payload["state"])
        for e in await store.read_all(limit=100_000, types=["TrialStateChanged"])
    ]
    assert states == [(11, "CANCELED")]


async def test_events_it_does_not_fold_count_in_the_versions_it_expects(
    store: EventStore,
) -> None:
    """Metrics on a trial's stream (types the scheduler does not fold) arrive as envelopes, so
    the version it expects is exact and its decision lands without losing a race."""
    await seed(store, trials=1, slots=1)
    runner = ConsumerRunner(store, None, SchedulerConsumer(store, Settings()))
    await runner.catch_up()
    [allocated] = await allocations(store)
    events: list[Event] = [
        TrialStarted(trial_id=11, allocation_id=allocated["allocation_id"], run_id=1, agent_id="a")
    ]
    events += [
        WorkloadCompleted(trial_id=11, run_id=1, steps_completed=n, metrics={"loss": 1 / n})
        for n in range(1, 6)
    ]
    events.append(
        TrialExited(
            trial_id=11, run_id=1, allocation_id=allocated["allocation_id"], outcome="completed"
        )
    )
    await store.append("trial-11", events)

    await runner.catch_up()

    assert runner.replans == 0
    assert runner.consumer.state.version("trial-11") == 8, "every event of the stream counted"
    closed = await store.read_all(limit=100_000, types=["TrialStateChanged"])
    assert [(e.payload["state"], e.stream_version) for e in closed] == [("COMPLETED", 9)]


async def test_replan_budget_exhausted_raises_to_the_caller(store: EventStore) -> None:
    """A plan that keeps losing is not retried forever: after max_replans the error surfaces,
    the checkpoint has not moved and nothing was appended by the scheduler."""
    await seed(store, trials=1, slots=1)
    steps = iter(range(1, 100))

    class AlwaysOvertaken(SchedulerConsumer):
        async def before_commit(self, tx: Transaction) -> None:
            metrics = WorkloadCompleted(
                trial_id=11, run_id=1, steps_completed=next(steps), metrics={}
            )
            await store.append("trial-11", [metrics])
            await super().before_commit(tx)

    runner = ConsumerRunner(store, None, AlwaysOvertaken(store, Settings()), max_replans=2)
    with pytest.raises(ConcurrencyError):
        await runner.catch_up()
    assert runner.replans == 3
    assert await store.checkpoint("scheduler") == 0
    assert await allocations(store) == []
