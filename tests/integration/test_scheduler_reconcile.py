"""The scheduler service reconciles runs with the agents' heartbeats on a real PostgreSQL: it reads
the heartbeat table inside its transaction and records what it decides."""

from __future__ import annotations

import json
from collections.abc import Sequence

from events.domain.types import (
    AgentRegistered,
    ExperimentSubmitted,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialStarted,
)
from events.domain.types.agent import Slot
from events.log.consumer import ConsumerRunner
from events.log.envelope import Event
from events.log.store import EventStore
from services.api import tables
from services.scheduler.planner import Settings
from services.scheduler.service import SchedulerConsumer

BEAT = """INSERT INTO agent_heartbeats (agent_id, beat_at, running, incarnation, seq)
          VALUES ('a', now(), $1::jsonb, 'i1', $2)
          ON CONFLICT (agent_id) DO UPDATE SET beat_at = now(), running = excluded.running,
              incarnation = excluded.incarnation, seq = excluded.seq"""


async def one_started_run(store: EventStore) -> ConsumerRunner:
    """Agent ``a`` (incarnation i1) runs allocation 1.1.1, listed from heartbeat 3; the scheduler
    (silence timeout far away) has folded all of it."""
    await tables.migrate(store)
    await store.append(
        "agent-a", [AgentRegistered(agent_id="a", slots=[Slot(slot_id="0")], incarnation="i1")]
    )
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config={})])
    requested = TrialRequested(
        experiment_id=1, trial_id=11, seq=1, request_id="r1", hparams={}, trial_seed=1
    )
    await store.append("experiment-1", [requested])
    runner = ConsumerRunner(store, None, SchedulerConsumer(store, Settings(), agent_timeout=1e6))
    await runner.catch_up()
    assert await types(store) == ["SlotsAllocated"]
    started = TrialStarted(
        trial_id=11,
        allocation_id="11.1",
        run_id=1,
        agent_id="a",
        agent_incarnation="i1",
        listed_from=3,
    )
    await store.append("trial-11", [started])
    await beat(store, ["11.1"], 3)
    await runner.catch_up()
    return runner


async def beat(store: EventStore, running: Sequence[str], seq: int) -> None:
    await store.execute(BEAT, json.dumps(list(running)), seq)


async def types(store: EventStore) -> list[str]:
    return [e.type for e in await store.read_stream("trial-11") if e.type != "TrialStarted"]


async def test_a_run_the_agent_stopped_listing_is_recorded_lost_and_restarted(
    store: EventStore,
) -> None:
    """Heartbeat 4 of the same process without the run: TrialExited(lost) + SlotsReleased are
    appended, then the trial restarts; catching up again decides nothing twice."""
    runner = await one_started_run(store)
    await beat(store, [], 4)
    await runner.catch_up()
    await runner.catch_up()
    await runner.catch_up()
    events = [e for e in await store.read_stream("trial-11")]
    kinds = [e.type for e in events]
    assert kinds == [
        "SlotsAllocated",
        "TrialStarted",
        "TrialExited",
        "SlotsReleased",
        "TrialRestarted",
        "SlotsAllocated",
    ]
    lost = events[2].payload
    assert (lost["allocation_id"], lost["outcome"]) == ("11.1", "lost")
    assert "heartbeat 4" in lost["message"]


async def test_an_exit_committed_after_the_head_was_read_is_not_declared_lost(
    store: EventStore,
) -> None:
    """The agent's exit report commits, and its next heartbeat drops the run, between the
    scheduler's read of the head and its read of the heartbeats: planning on that state appends
    no second, 'lost', exit (and does not even lose a version race over it)."""
    runner = await one_started_run(store)
    consumer = runner.consumer
    assert isinstance(consumer, SchedulerConsumer)
    exited: list[Event] = [
        TrialExited(trial_id=11, run_id=1, allocation_id="11.1", outcome="completed", exit_code=0),
        SlotsReleased(trial_id=11, allocation_id="11.1", placements={"a": ["0"]}),
    ]
    await store.append("trial-11", exited)
    await beat(store, [], 4)
    async with store.transaction() as tx:  # the state has not folded the exit
        await consumer.before_commit(tx)
    assert await types(store) == ["SlotsAllocated", "TrialExited", "SlotsReleased"]
    await runner.catch_up()
    kinds = await types(store)
    assert kinds.count("TrialExited") == 1 and kinds[-1] == "TrialStateChanged"
