"""Usage billing (``services/tracker/usage.py``, ``GET /api/v1/usage``) on a real PostgreSQL.

Schedules of allocation facts are appended to the log and given chosen recorded times (a
synthetic history, as a fixture would be), so the expected slot-milliseconds are known exactly.
"""

from __future__ import annotations

import itertools
import os
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from events.domain.config import parse_config
from events.domain.names import allocation_id, experiment_stream, trial_stream
from events.domain.types import (
    AgentLost,
    AgentRegistered,
    ExperimentSubmitted,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
)
from events.domain.types.agent import Slot
from events.log.consumer import ConsumerRunner
from events.log.envelope import Event
from events.log.store import EventStore
from services.api.auth import create_user
from services.tracker import schema, usage
from tests.integration.test_api_support import CONFIG, running_api

BASE = datetime(2026, 3, 1, 22, 0, tzinfo=UTC)
"""Schedules start two hours before a midnight, so many cross one."""
AGENTS = {"gpu": ("default", "cuda"), "cpu": ("cpu-pool", "cpu")}
"""Agent kind -> (resource pool, slot type) of its four slots."""
_ids = itertools.count(1000)
EXAMPLES = int(os.environ.get("CAIRN_PROPERTY_EXAMPLES", "3"))
"""Random schedules per run: a few in ``make test``, many in ``make property``."""


@dataclass(frozen=True)
class Alloc:
    """One allocation of a schedule: ``slots`` slots of agent ``kind``, owned by ``owner``,
    from ``start_us`` for ``length_us`` microseconds after BASE; ``end``: how it ends."""

    owner: int
    kind: str
    slots: int
    start_us: int
    length_us: int
    end: str  # exited | released | lost | open


allocs = st.builds(
    Alloc,
    owner=st.integers(0, 1),
    kind=st.sampled_from(sorted(AGENTS)),
    slots=st.integers(1, 4),
    start_us=st.integers(0, 3 * 86_400_000_000),
    length_us=st.integers(0, 2 * 86_400_000_000),
    end=st.sampled_from(["exited", "released", "lost", "open"]),
)


def ms(us: int) -> int:
    """Epoch milliseconds of BASE + ``us`` microseconds (truncated, as the projection does)."""
    return usage.epoch_ms(BASE + timedelta(microseconds=us))


async def write_history(
    store: EventStore, tag: int, schedule: list[Alloc]
) -> tuple[list[str], dict[tuple[str, str, str], int], list[Alloc]]:
    """Appends the schedule's facts in time order with their recorded times; returns the owners,
    the expected slot-ms per (owner, pool, slot type) of closed allocations, and the open ones."""
    owners = [f"u{tag}a", f"u{tag}b"]
    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    timed: list[tuple[int, str, Event]] = []  # (us, stream, event)
    agent_ids = {kind: f"{kind}-{tag}" for kind in AGENTS}
    for kind, agent in agent_ids.items():
        pool, device = AGENTS[kind]
        slots = [Slot(slot_id=str(i), device=device) for i in range(4)]  # type: ignore[arg-type]
        timed.append(
            (-2, f"agent-{agent}", AgentRegistered(agent_id=agent, resource_pool=pool, slots=slots))
        )
    experiments = [next(_ids), next(_ids)]
    for owner, exp in zip(owners, experiments, strict=True):
        timed.append(
            (
                -1,
                experiment_stream(exp),
                ExperimentSubmitted(experiment_id=exp, config=config, owner=owner),
            )
        )
    expected: dict[tuple[str, str, str], int] = defaultdict(int)
    still_open: list[Alloc] = []
    for n, a in enumerate(schedule):
        trial = next(_ids)
        exp = experiments[a.owner]
        alloc = allocation_id(trial, 1)
        agent = agent_ids[a.kind]
        stream = trial_stream(trial)
        timed.append(
            (
                a.start_us,
                experiment_stream(exp),
                TrialRequested(
                    experiment_id=exp,
                    trial_id=trial,
                    seq=n + 1,
                    request_id=f"r{trial}",
                    hparams={},
                    trial_seed=1,
                ),
            )
        )
        placements = {agent: [str(i) for i in range(a.slots)]}
        timed.append(
            (
                a.start_us,
                stream,
                SlotsAllocated(trial_id=trial, allocation_id=alloc, placements=placements),
            )
        )
        end = a.start_us + a.length_us
        exited = TrialExited(trial_id=trial, run_id=1, allocation_id=alloc, outcome="completed")
        released = SlotsReleased(trial_id=trial, allocation_id=alloc, placements=placements)
        if a.end == "open":
            still_open.append(a)
            continue
        if a.end == "exited":
            timed += [(end, stream, exited), (end + 5_000, stream, released)]
        elif a.end == "released":
            timed.append((end, stream, released))
        else:  # the agent goes silent at `end`; the scheduler's verdict comes 30 s later
            timed.append((end, f"agent-{agent}", AgentLost(agent_id=agent)))
            end += 30_000_000
            lost = exited.model_copy(update={"outcome": "lost"})
            timed += [(end, stream, lost), (end, stream, released)]
        pool, device = AGENTS[a.kind]
        expected[(owners[a.owner], pool, device)] += a.slots * (ms(end) - ms(a.start_us))
    timed.sort(key=lambda item: item[0])  # stable: same-instant facts keep their causal order
    async with store.transaction() as tx:
        positions = [(await tx.append(stream, [event]))[0].position for _, stream, event in timed]
        await tx.conn.execute(
            """UPDATE events e SET recorded_at = u.at
               FROM unnest($1::bigint[], $2::timestamptz[]) AS u(position, at)
               WHERE e.position = u.position""",
            positions,
            [BASE + timedelta(microseconds=max(us, 0)) for us, _, _ in timed],
        )
    return owners, expected, still_open


async def usage_rows(store: EventStore) -> list[dict[str, Any]]:
    """Every ``tr_usage`` row, in key order."""
    rows = await store.fetch(
        "SELECT * FROM tr_usage ORDER BY allocation_id, resource_pool, slot_type"
    )
    return [dict(r) for r in rows]


@example(
    schedule=[
        Alloc(owner=0, kind="gpu", slots=4, start_us=3_599_999_999, length_us=1, end="lost"),
        Alloc(owner=1, kind="cpu", slots=1, start_us=1_000, length_us=86_400_000_001, end="exited"),
        Alloc(owner=0, kind="cpu", slots=2, start_us=7_000_000_500, length_us=0, end="released"),
        Alloc(owner=1, kind="gpu", slots=3, start_us=5, length_us=9, end="open"),
    ]
)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(schedule=st.lists(allocs, max_size=6))
async def test_billed_slot_ms_equal_the_allocation_intervals_and_rebuild_equal(
    store: EventStore, schedule: list[Alloc]
) -> None:
    """For random schedules, billed slot-ms per user, pool and slot type equal the sum of the
    allocation intervals (a lost agent's run up to the scheduler's verdict), days add up to the
    same, and a rebuild gives the same rows to the millisecond."""
    await schema.migrate(store)
    tag = next(_ids)
    owners, expected, still_open = await write_history(store, tag, schedule)
    await ConsumerRunner(store, None, usage.UsageConsumer()).catch_up()

    start, end = ms(-86_400_000_000), ms(10 * 86_400_000_000)
    now = ms(6 * 86_400_000_000)
    got: dict[tuple[str, str, str], int] = defaultdict(int)
    async with store.connection() as conn:
        spans = [s for s in await usage.spans(conn, start, end) if s.owner in owners]
        day_total = sum(r["slot_ms"] for r in usage.aggregate(spans, start, end, "day", now))
    for span in spans:
        if span.ended_ms is not None:
            got[(span.owner, span.resource_pool, span.slot_type)] += span.slots * (
                span.ended_ms - span.started_ms
            )
    assert dict(got) == dict(expected)
    open_ms = sum(a.slots * (now - ms(a.start_us)) for a in still_open)
    assert day_total == sum(expected.values()) + open_ms
    by_user = usage.aggregate(spans, start, end, "user", now)
    assert sum(r["slot_ms"] for r in by_user) == day_total

    before = await usage_rows(store)
    await usage.rebuild(store)
    assert await usage_rows(store) == before


async def test_usage_api_shows_each_user_their_own_and_admins_everything(
    store: EventStore, tmp_path: Path
) -> None:
    """GET /api/v1/usage: a user sees only their usage (403 for another's), an admin everyone's;
    by pool and by day; CSV with exact three-decimal seconds; a bad date is a 400."""
    await schema.migrate(store)
    schedule = [
        Alloc(
            owner=0, kind="gpu", slots=2, start_us=7_200_000_123, length_us=1_500_250, end="exited"
        ),
        Alloc(owner=1, kind="cpu", slots=3, start_us=0, length_us=10_000_000, end="released"),
    ]
    owners, expected, _ = await write_history(store, next(_ids), schedule)
    await ConsumerRunner(store, None, usage.UsageConsumer()).catch_up()
    alice, bob = owners
    async with running_api(store, tmp_path) as api:
        admin = await api.login()
        for name in owners:
            assert await create_user(store, name, "pw", admin=False)
        token = await api.login(alice, "pw")
        window = "from=2026-03-01&to=2026-03-02"

        mine = await api.ok("GET", f"/api/v1/usage?{window}&by=user", token)
        assert [(r["user"], r["slot_type"], r["slot_ms"]) for r in mine["rows"]] == [
            (alice, "cuda", expected[(alice, "default", "cuda")])
        ]
        status, _ = await api.call("GET", f"/api/v1/usage?{window}&user={bob}", token)
        assert status == 403

        everyone = await api.ok("GET", f"/api/v1/usage?{window}&by=pool", admin)
        pools = {r["pool"]: r["slot_ms"] for r in everyone["rows"]}
        assert pools["cpu-pool"] >= expected[(bob, "cpu-pool", "cpu")]
        assert pools["default"] >= expected[(alice, "default", "cuda")]

        days = await api.ok("GET", f"/api/v1/usage?{window}&by=day&user={bob}", admin)
        assert [(r["day"], r["slot_ms"]) for r in days["rows"]] == [("2026-03-01", 3 * 10_000)]

        status, body = await api.call("GET", f"/api/v1/usage?{window}&format=csv", token)
        assert status == 200
        cuda = expected[(alice, "default", "cuda")]
        assert body.decode().splitlines() == [
            "user,slot_type,slot_seconds,slot_ms",
            f"{alice},cuda,{cuda // 1000}.{cuda % 1000:03d},{cuda}",
        ]

        status, body = await api.call("GET", "/api/v1/usage?from=yesterday", token)
        assert status == 400 and "from" in str(body)
