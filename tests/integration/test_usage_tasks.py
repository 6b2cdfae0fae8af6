"""Tasks in usage billing: a task's slots are billed to its owner from ``TaskAllocated`` to
``TaskExited``, beside the trials, by the same projection (``services/tracker/usage.py``)."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from events.domain.names import task_allocation_id, task_stream
from events.domain.types import AgentRegistered, TaskAllocated, TaskExited, TaskRequested
from events.domain.types.agent import Slot
from events.log.consumer import ConsumerRunner
from events.log.envelope import Event
from events.log.store import EventStore
from services.api.auth import create_user
from services.tracker import schema, usage
from tests.integration.test_api_support import running_api

BASE = datetime(2026, 4, 1, 23, 0, tzinfo=UTC)
_ids = itertools.count(1)
EXAMPLES = int(os.environ.get("CAIRN_PROPERTY_EXAMPLES", "3"))


@dataclass(frozen=True)
class Run:
    """One task: ``slots`` slots from ``start_us`` after BASE for ``length_us``; ``end``: how
    it ends (``canceled``: killed before it was placed, so never allocated)."""

    slots: int
    start_us: int
    length_us: int
    end: str  # completed | lost | canceled | open


runs = st.builds(
    Run,
    slots=st.integers(0, 4),
    start_us=st.integers(0, 2 * 86_400_000_000),
    length_us=st.integers(0, 86_400_000_000),
    end=st.sampled_from(["completed", "lost", "canceled", "open"]),
)


def ms(us: int) -> int:
    return usage.epoch_ms(BASE + timedelta(microseconds=us))


async def write_tasks(store: EventStore, owner: str, schedule: list[Run]) -> tuple[int, list[Run]]:
    """Appends the tasks' facts at their recorded times; returns the expected slot-ms of the
    ended ones and the runs still open."""
    tag = next(_ids)
    agent = f"task-agent-{owner}-{tag}"
    timed: list[tuple[int, str, Event]] = [
        (
            -1,
            f"agent-{agent}",
            AgentRegistered(agent_id=agent, slots=[Slot(slot_id=str(i)) for i in range(4)]),
        )
    ]
    expected, still_open = 0, []
    for n, run in enumerate(schedule):
        task_id = f"{tag:08x}{n:08x}"
        stream, alloc = task_stream(task_id), task_allocation_id(task_id)
        timed.append(
            (
                run.start_us,
                stream,
                TaskRequested(
                    task_id=task_id, kind="command", owner=owner, argv=["x"], workspace_id=1
                ),
            )
        )
        end = run.start_us + run.length_us
        if run.end == "canceled":
            timed.append((end, stream, TaskExited(task_id=task_id, outcome="canceled")))
            continue
        placements = {agent: [str(i) for i in range(run.slots)]}
        timed.append(
            (
                run.start_us,
                stream,
                TaskAllocated(task_id=task_id, allocation_id=alloc, placements=placements),
            )
        )
        if run.end == "open":
            still_open.append(run)
            continue
        outcome = "completed" if run.end == "completed" else "lost"
        timed.append(
            (end, stream, TaskExited(task_id=task_id, allocation_id=alloc, outcome=outcome))
        )
        expected += run.slots * (ms(end) - ms(run.start_us))
    timed.sort(key=lambda item: item[0])
    async with store.transaction() as tx:
        positions = [(await tx.append(s, [e]))[0].position for _, s, e in timed]
        await tx.conn.execute(
            """UPDATE events e SET recorded_at = u.at
               FROM unnest($1::bigint[], $2::timestamptz[]) AS u(position, at)
               WHERE e.position = u.position""",
            positions,
            [BASE + timedelta(microseconds=max(us, 0)) for us, _, _ in timed],
        )
    return expected, still_open


@example(
    schedule=[
        Run(slots=2, start_us=3_599_999_999, length_us=1, end="completed"),
        Run(slots=0, start_us=5, length_us=1_000_000, end="completed"),
        Run(slots=1, start_us=0, length_us=86_400_000_001, end="lost"),
        Run(slots=3, start_us=7, length_us=9, end="canceled"),
        Run(slots=4, start_us=11, length_us=0, end="open"),
    ]
)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=st.lists(runs, max_size=6))
async def test_a_tasks_slot_ms_equal_its_allocation_interval_and_rebuild_equal(
    store: EventStore, schedule: list[Run]
) -> None:
    """For random tasks, each billed span is the task's slots times its interval from
    ``TaskAllocated`` to ``TaskExited`` (a canceled or zero-slot task bills nothing, an open one
    counts up to now), and a rebuild gives the same rows."""
    await schema.migrate(store)
    owner = f"tasker{next(_ids)}"
    expected, still_open = await write_tasks(store, owner, schedule)
    await ConsumerRunner(store, None, usage.UsageConsumer()).catch_up()
    start, end, now = ms(-86_400_000_000), ms(10 * 86_400_000_000), ms(5 * 86_400_000_000)
    async with store.connection() as conn:
        spans = await usage.spans(conn, start, end, owner=owner)
    closed = sum(s.slots * (s.ended_ms - s.started_ms) for s in spans if s.ended_ms is not None)
    assert closed == expected
    assert all(s.experiment_id is None and s.slots > 0 for s in spans)
    by_user = usage.aggregate(spans, start, end, "user", now)
    open_ms = sum(r.slots * (now - ms(r.start_us)) for r in still_open if r.slots)
    assert sum(r["slot_ms"] for r in by_user) == expected + open_ms
    rows = "SELECT * FROM tr_usage ORDER BY allocation_id, resource_pool, slot_type"
    before = [dict(r) for r in await store.fetch(rows)]
    await usage.rebuild(store)
    assert [dict(r) for r in await store.fetch(rows)] == before


async def test_usage_api_bills_a_users_task_to_them_and_apart_from_experiments(
    store: EventStore, tmp_path: Path
) -> None:
    """GET /api/v1/usage: a user's task counts in their usage by user; by experiment it is the
    row with no experiment."""
    await schema.migrate(store)
    owner = f"tasker{next(_ids)}"
    schedule = [Run(slots=2, start_us=60_000_000, length_us=1_500_250, end="completed")]
    expected, _ = await write_tasks(store, owner, schedule)
    await ConsumerRunner(store, None, usage.UsageConsumer()).catch_up()
    async with running_api(store, tmp_path) as api:
        await api.login()
        assert await create_user(store, owner, "pw", admin=False)
        token = await api.login(owner, "pw")
        window = "from=2026-04-01&to=2026-04-02"
        mine = await api.ok("GET", f"/api/v1/usage?{window}&by=user", token)
        assert [(r["user"], r["slot_ms"]) for r in mine["rows"]] == [(owner, expected)]
        per_exp = await api.ok("GET", f"/api/v1/usage?{window}&by=experiment", token)
        assert [(r["experiment"], r["slot_ms"]) for r in per_exp["rows"]] == [(None, expected)]
