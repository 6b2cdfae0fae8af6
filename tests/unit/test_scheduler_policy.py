"""Unit and property tests of the pure scheduling policy (services.scheduler.policy)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.scheduler.policy import (
    Agent,
    Allocate,
    Allocation,
    ClusterView,
    Decision,
    PendingRequest,
    Placement,
    PoolConfig,
    Preempt,
    Slot,
    decide,
    water_fill,
)

T = TypeVar("T")

# ---- helpers --------------------------------------------------------------------------------------


def agent(
    agent_id: str,
    slots: int,
    pool: str = "default",
    enabled: bool = True,
    disabled_slots: Sequence[int] = (),
) -> Agent:
    return Agent(
        agent_id,
        pool,
        tuple(Slot(f"s{j}", enabled=j not in disabled_slots) for j in range(slots)),
        enabled=enabled,
    )


def req(
    request_id: str,
    slots: int = 1,
    *,
    exp: str = "e1",
    order: int = 0,
    priority: int = 42,
    weight: float = 1.0,
    pool: str = "",
    max_slots: int | None = None,
    preemptible: bool = True,
) -> PendingRequest:
    return PendingRequest(
        request_id=request_id,
        experiment_id=exp,
        slots_needed=slots,
        order=order,
        trial_id=order,
        priority=priority,
        weight=weight,
        resource_pool=pool,
        max_slots=max_slots,
        preemptible=preemptible,
    )


def alloc(
    request_id: str,
    where: dict[str, Sequence[str]],
    *,
    exp: str = "e0",
    priority: int = 42,
    order: int = 0,
    pool: str = "",
    preemptible: bool = True,
    requested: bool = False,
    weight: float = 1.0,
) -> Allocation:
    return Allocation(
        request_id=request_id,
        experiment_id=exp,
        placements=tuple(Placement(a, tuple(s)) for a, s in sorted(where.items())),
        resource_pool=pool,
        priority=priority,
        order=order,
        preemptible=preemptible,
        preemption_requested=requested,
        weight=weight,
    )


def slots_of(n: int, start: int = 0) -> list[str]:
    return [f"s{j}" for j in range(start, start + n)]


def allocs(decisions: Sequence[Decision]) -> dict[str, tuple[Placement, ...]]:
    return {d.request_id: d.placements for d in decisions if isinstance(d, Allocate)}


def preempts(decisions: Sequence[Decision]) -> list[str]:
    return [d.request_id for d in decisions if isinstance(d, Preempt)]


def view(
    agents: Sequence[Agent],
    pending: Sequence[PendingRequest] = (),
    allocations: Sequence[Allocation] = (),
    pools: Sequence[PoolConfig] = (),
    **kw: str,
) -> ClusterView:
    return ClusterView(
        agents=tuple(agents),
        pending=tuple(pending),
        allocations=tuple(allocations),
        pools=tuple(pools),
        **kw,
    )


def per_exp(decisions: Sequence[Decision], pending: Sequence[PendingRequest]) -> Counter[str]:
    owner = {r.request_id: r.experiment_id for r in pending}
    got: Counter[str] = Counter()
    for d in decisions:
        if isinstance(d, Allocate):
            got[owner[d.request_id]] += d.slots
    return got


PREEMPTIVE = (PoolConfig("default", "priority", preemption=True),)
FAIR = (PoolConfig("default", "fair_share"),)


# ---- gang placement -----------------------------------------------------------------------------


def test_gang_is_all_or_nothing() -> None:
    """A gang that cannot get all its slots gets none, even when some slots are free."""
    agents = [agent("a1", 4), agent("a2", 4)]
    busy = [alloc("x", {"a1": slots_of(2)}), alloc("y", {"a2": slots_of(3)})]
    out = decide(view(agents, [req("r", 3)], busy))
    assert out == []


def test_single_agent_best_fit_with_id_tie_break() -> None:
    """A gang goes to the agent with the fewest free slots that still fit it, ties by agent id."""
    agents = [agent("a1", 8), agent("a2", 4), agent("a3", 4), agent("a4", 2)]
    out = decide(view(agents, [req("r", 3)]))
    assert allocs(out) == {"r": (Placement("a2", ("s0", "s1", "s2")),)}


def test_multi_agent_split_is_even_and_uses_fewest_agents() -> None:
    """8 slots over 4-slot agents split 2 x 4, preferring the fewest agents possible."""
    agents = [agent(f"a{i}", 4) for i in range(4)]
    out = decide(view(agents, [req("r", 8)]))
    assert allocs(out) == {
        "r": (Placement("a0", tuple(slots_of(4))), Placement("a1", tuple(slots_of(4))))
    }


def test_split_requires_divisible_per_agent_counts() -> None:
    """A gang splits only into equal per-agent counts: 6 on 4+4 free is 2 x 3, 7 never fits."""
    agents = [agent("a1", 4), agent("a2", 4)]
    out = decide(view(agents, [req("six", 6)]))
    assert [len(p.slot_ids) for p in allocs(out)["six"]] == [3, 3]
    assert decide(view(agents, [req("seven", 7)])) == []


def test_split_prefers_larger_per_agent_count_and_best_fit_agents() -> None:
    """With free counts 2,2,2,2,4,4,5 an 8-gang takes 2 x 4 on the two exactly-4-free agents."""
    agents = [agent(f"a{i}", 4) for i in range(4)] + [agent("b1", 4), agent("b2", 4), agent("c", 8)]
    busy = [alloc(f"x{i}", {f"a{i}": slots_of(2)}) for i in range(4)]
    busy.append(alloc("xc", {"c": slots_of(3)}))
    out = allocs(decide(view(agents, [req("r", 8)], busy)))
    assert [(p.agent_id, len(p.slot_ids)) for p in out["r"]] == [("b1", 4), ("b2", 4)]


def test_disabled_agents_and_slots_are_never_used() -> None:
    """Disabled agents and disabled slots are never allocated, even when that means waiting."""
    agents = [agent("a1", 4, enabled=False), agent("a2", 4, disabled_slots=(0, 2))]
    out = decide(
        view(agents, [req("r1", 1, order=1), req("r2", 1, order=2), req("r3", 1, order=3)])
    )
    got = allocs(out)
    assert set(got) == {"r1", "r2"}
    used = {(p.agent_id, s) for ps in got.values() for p in ps for s in p.slot_ids}
    assert used == {("a2", "s1"), ("a2", "s3")}


def test_pools_are_isolated_and_empty_pool_name_means_default() -> None:
    """Requests only use agents of their own pool; '' resolves to the default pool."""
    agents = [agent("g1", 2, pool="gpu"), agent("c1", 2, pool="cpu"), agent("d1", 1, pool="main")]
    pending = [
        req("g", 2, pool="gpu", order=1),
        req("c", 2, pool="cpu", order=2),
        req("d", 1, order=3),
        req("nowhere", 1, pool="missing", order=4),
        req("g-too-many", 1, pool="gpu", order=5),
    ]
    v = view(agents, pending, pools=[PoolConfig("gpu", "fair_share")], default_pool="main")
    assert v.pool_config("gpu").scheduler == "fair_share"
    assert v.pool_config("cpu") == PoolConfig("cpu")
    got = allocs(decide(v))
    assert {r: {p.agent_id for p in ps} for r, ps in got.items()} == {
        "g": {"g1"},
        "c": {"c1"},
        "d": {"d1"},
    }


# ---- priority -------------------------------------------------------------------------------------


def test_priority_order_then_fifo_by_order_key() -> None:
    """Lower priority numbers go first; within a priority the smaller order key goes first."""
    agents = [agent("a", 3)]
    pending = [
        req("late-important", order=9, priority=10),
        req("zz-early", order=1, priority=42),
        req("aa-late", order=5, priority=42),
        req("unimportant", order=0, priority=90),
    ]
    out = decide(view(agents, pending))
    assert [d.request_id for d in out] == ["late-important", "zz-early", "aa-late"]


def test_blocked_gang_reserves_draining_agent_and_smaller_ones_backfill_elsewhere() -> None:
    """A blocked big gang reserves the agent closest to fitting it; smaller requests backfill."""
    agents = [agent("a", 4), agent("b", 4), agent("c", 4)]
    busy = [
        alloc("xa", {"a": slots_of(3)}),
        alloc("xb", {"b": slots_of(1)}),
        alloc("xc", {"c": slots_of(3)}),
    ]
    pending = [
        req("big", 4, priority=10, order=1),
        req("s1", 1, priority=50, order=2),
        req("s2", 1, priority=50, order=3),
        req("s3", 1, priority=50, order=4),
    ]
    got = allocs(decide(view(agents, pending, busy)))
    assert {r: ps[0].agent_id for r, ps in got.items()} == {"s1": "a", "s2": "c"}


def test_request_that_can_never_fit_blocks_nobody() -> None:
    """A gang bigger than the pool can ever hold is skipped without reserving anything."""
    agents = [agent("a", 8)]
    got = allocs(decide(view(agents, [req("huge", 16, priority=1), req("small", 8, priority=90)])))
    assert set(got) == {"small"}


def test_preemption_picks_lowest_priority_newest_first() -> None:
    """With preemption on, the lowest-priority then newest allocation is preempted first."""
    agents = [agent("a", 4)]
    busy = [
        alloc("old-low", {"a": ["s0"]}, priority=60, order=1),
        alloc("new-low", {"a": ["s1"]}, priority=60, order=2),
        alloc("mid", {"a": ["s2", "s3"]}, priority=40, order=3),
    ]
    out = decide(view(agents, [req("hi", 1, priority=10)], busy, PREEMPTIVE))
    assert preempts(out) == ["new-low"]
    assert allocs(out) == {}
    out2 = decide(view(agents, [req("hi2", 2, priority=10)], busy, PREEMPTIVE))
    assert preempts(out2) == ["new-low", "old-low"]


def test_preemption_never_targets_equal_priority_or_non_preemptible() -> None:
    """Only strictly less important, preemptible allocations are preempted."""
    agents = [agent("a", 2)]
    busy = [
        alloc("same", {"a": ["s0"]}, priority=20, order=5),
        alloc("pinned", {"a": ["s1"]}, priority=90, order=6, preemptible=False),
    ]
    assert decide(view(agents, [req("hi", 1, priority=20)], busy, PREEMPTIVE)) == []


def test_already_requested_preemption_is_not_repeated() -> None:
    """Slots of an allocation already asked to release count as coming; nobody is preempted twice."""
    agents = [agent("a", 2)]
    busy = [
        alloc("going", {"a": ["s0"]}, priority=60, order=2, requested=True),
        alloc("other", {"a": ["s1"]}, priority=60, order=1),
    ]
    out = decide(view(agents, [req("hi", 1, priority=10)], busy, PREEMPTIVE))
    assert out == []
    out = decide(
        view(
            agents,
            [req("h1", 1, priority=10), req("h2", 1, priority=10, order=1)],
            busy,
            PREEMPTIVE,
        )
    )
    assert preempts(out) == ["other"]


def test_preempted_slots_are_not_given_to_anyone_else_in_the_pass() -> None:
    """Free slots promised to a preempting request are withheld from later requests."""
    agents = [agent("a", 4)]
    busy = [alloc("low", {"a": ["s0", "s1"]}, priority=80)]
    pending = [req("hi", 4, priority=10, order=1), req("filler", 1, priority=50, order=2)]
    out = decide(view(agents, pending, busy, PREEMPTIVE))
    assert out == [Preempt("low", "preempted for hi (priority 10)")]


def test_preemption_only_preempts_allocations_the_placement_uses() -> None:
    """A candidate whose slots the chosen placement does not use is left running."""
    agents = [agent("a", 2), agent("b", 4)]
    busy = [
        alloc("tiny", {"a": ["s0"]}, priority=90, order=9),
        alloc("wide", {"b": slots_of(4)}, priority=80, order=1),
    ]
    out = decide(view(agents, [req("hi", 4, priority=10)], busy, PREEMPTIVE))
    assert preempts(out) == ["wide"]


def test_no_preemption_when_pool_preemption_is_off() -> None:
    """A pool without preemption never preempts, whatever the priorities."""
    agents = [agent("a", 2)]
    busy = [alloc("low", {"a": slots_of(2)}, priority=99)]
    assert decide(view(agents, [req("hi", 1, priority=1)], busy)) == []
    fair = (PoolConfig("default", "fair_share", preemption=False),)
    assert decide(view(agents, [req("hi", 1, priority=1, exp="e9")], busy, fair)) == []


# ---- fair share -----------------------------------------------------------------------------------


def test_fair_share_is_proportional_to_weights() -> None:
    """Weights 1:3 on 8 free slots give 2:6 when both experiments want more."""
    pending = [req(f"a{i}", exp="A", weight=1, order=i) for i in range(10)]
    pending += [req(f"b{i}", exp="B", weight=3, order=100 + i) for i in range(10)]
    out = decide(view([agent("n1", 4), agent("n2", 4)], pending, pools=FAIR))
    assert per_exp(out, pending) == {"A": 2, "B": 6}


def test_fair_share_never_exceeds_demand_and_refills_the_rest() -> None:
    """An experiment wanting less than its share gets exactly its demand; others take the rest."""
    pending = [req("a0", exp="A", weight=5, order=0)]
    pending += [req(f"b{i}", exp="B", weight=1, order=1 + i) for i in range(10)]
    out = decide(view([agent("n", 8)], pending, pools=FAIR))
    assert per_exp(out, pending) == {"A": 1, "B": 7}


def test_water_fill_rounds_to_capacity_deterministically() -> None:
    """Integer shares sum to the capacity, respect demand and break rounding ties by id."""
    from fractions import Fraction

    w = {"x": Fraction(1), "y": Fraction(1), "z": Fraction(1)}
    assert water_fill({"x": 9, "y": 9, "z": 9}, w, 8) == {"x": 3, "y": 3, "z": 2}
    assert water_fill({"x": 1, "y": 9, "z": 0}, w, 8) == {"x": 1, "y": 7, "z": 0}
    assert water_fill({"x": 2, "y": 3}, w, 100) == {"x": 2, "y": 3}


def test_fair_share_counts_current_holdings() -> None:
    """An experiment already above its share gets nothing new while another is below it."""
    agents = [agent("n", 8)]
    busy = [alloc(f"h{i}", {"n": [f"s{i}"]}, exp="A", order=i) for i in range(6)]
    pending = [req(f"a{i}", exp="A", order=10 + i) for i in range(4)]
    pending += [req(f"b{i}", exp="B", order=20 + i) for i in range(4)]
    out = decide(view(agents, pending, busy, FAIR))
    assert per_exp(out, pending) == {"B": 2}


def test_fair_share_preemption_brings_over_share_experiment_down_to_share() -> None:
    """With preemption, the newest allocations of an over-share experiment are preempted to share."""
    agents = [agent("n", 8)]
    busy = [alloc(f"h{i}", {"n": [f"s{i}"]}, exp="A", order=i) for i in range(8)]
    pending = [req(f"b{i}", exp="B", order=20 + i) for i in range(6)]
    fair = (PoolConfig("default", "fair_share", preemption=True),)
    out = decide(view(agents, pending, busy, fair))
    assert sorted(preempts(out)) == ["h4", "h5", "h6", "h7"]
    assert allocs(out) == {}


def test_fair_share_backfills_slots_left_by_gang_shapes() -> None:
    """Slots a share cannot use because of gang sizes go to whoever can use them."""
    pending = [req(f"a{i}", 4, exp="A", order=i) for i in range(3)]
    pending += [req(f"b{i}", 1, exp="B", order=10 + i) for i in range(10)]
    out = decide(view([agent("n1", 4), agent("n2", 4), agent("n3", 2)], pending, pools=FAIR))
    got = per_exp(out, pending)
    assert sum(got.values()) == 10 and got["A"] == 4


# ---- max_slots and zero-slot tasks --------------------------------------------------------------


@pytest.mark.parametrize("pools", [(), FAIR], ids=["priority", "fair_share"])
def test_max_slots_caps_what_an_experiment_holds(pools: tuple[PoolConfig, ...]) -> None:
    """No policy lets an experiment hold more than max_slots; a gang over the cap lets others by."""
    agents = [agent("n", 8)]
    busy = [alloc("h", {"n": ["s0"]}, exp="A")]
    pending = [req("big", 4, exp="A", max_slots=4, order=1)]
    pending += [req(f"a{i}", 1, exp="A", max_slots=4, order=2 + i) for i in range(5)]
    out = decide(view(agents, pending, busy, pools))
    assert per_exp(out, pending) == {"A": 3}
    assert "big" not in allocs(out)


def test_zero_slot_tasks_are_admitted_apart() -> None:
    """Zero-slot tasks need no free slot, spread by load over enabled agents, ignore max_slots."""
    agents = [agent("a", 1), agent("b", 1), agent("off", 1, enabled=False)]
    busy = [
        alloc("full-a", {"a": ["s0"]}),
        alloc("full-b", {"b": ["s0"]}),
        alloc("tb", {"a": []}, exp="E"),
    ]
    pending = [req(f"z{i}", 0, exp="E", max_slots=0, order=i) for i in range(3)]
    got = allocs(decide(view(agents, pending, busy)))
    assert got == {
        "z0": (Placement("b", ()),),
        "z1": (Placement("a", ()),),
        "z2": (Placement("b", ()),),
    }


def test_zero_slot_tasks_use_aux_pool_and_per_agent_limit() -> None:
    """Zero-slot requests default to the aux pool and wait once every agent is at its limit."""
    agents = [agent("aux1", 0, pool="aux"), agent("gpu1", 8, pool="gpu")]
    pools = (PoolConfig("aux", max_zero_slot_tasks_per_agent=2),)
    pending = [req(f"z{i}", 0, order=i) for i in range(3)]
    got = allocs(
        decide(view(agents, pending, (), pools, default_pool="gpu", default_aux_pool="aux"))
    )
    assert got == {"z0": (Placement("aux1", ()),), "z1": (Placement("aux1", ()),)}


# ---- input hygiene --------------------------------------------------------------------------------


def test_invalid_inputs_are_rejected() -> None:
    """Out-of-range priorities, negative sizes, bad weights and duplicate ids raise ValueError."""
    with pytest.raises(ValueError):
        req("p", priority=0)
    with pytest.raises(ValueError):
        req("n", slots=-1)
    with pytest.raises(ValueError):
        req("w", weight=0)
    with pytest.raises(ValueError):
        decide(view([agent("a", 1), agent("a", 2)]))
    with pytest.raises(ValueError):
        decide(view([agent("a", 1)], [req("r"), req("r")]))


def test_pending_request_that_is_already_allocated_is_ignored() -> None:
    """A request id that already has an allocation is never allocated twice."""
    agents = [agent("a", 2)]
    busy = [alloc("r", {"a": ["s0"]})]
    assert decide(view(agents, [req("r")], busy)) == []


# ---- determinism and invariants over random clusters -------------------------------------------


def random_view(seed: int, preemption: bool, scheduler: str) -> ClusterView:
    """A random but self-consistent cluster with two pools, holes, holdings and pending work."""
    rng = random.Random(seed)
    agents: list[Agent] = []
    for i in range(rng.randint(0, 12)):
        n = rng.choice([0, 1, 2, 4, 4, 8])
        disabled = [j for j in range(n) if rng.random() < 0.15]
        pool = rng.choice(["p1", "p1", "p2"])
        agents.append(agent(f"a{i:02d}", n, pool, rng.random() > 0.1, disabled))
    free = {a.id: [s.id for s in a.slots] for a in agents}
    allocations: list[Allocation] = []
    for k in range(rng.randint(0, 10)):
        a = rng.choice(agents) if agents else None
        if a is None or not free[a.id]:
            continue
        take = free[a.id][: rng.randint(1, len(free[a.id]))]
        free[a.id] = free[a.id][len(take) :]
        allocations.append(
            alloc(
                f"x{k}",
                {a.id: take},
                exp=f"e{rng.randint(0, 3)}",
                priority=rng.randint(1, 99),
                order=rng.randint(0, 50),
                pool=a.resource_pool,
                preemptible=rng.random() > 0.2,
                requested=rng.random() < 0.2,
                weight=1,
            )
        )
    exps = {f"e{e}": (rng.choice([0.5, 1, 3]), rng.choice([None, None, 4, 8])) for e in range(4)}
    pending = []
    for k in range(rng.randint(0, 25)):
        e = f"e{rng.randint(0, 3)}"
        w, cap = exps[e]
        pending.append(
            req(
                f"r{k}",
                rng.choice([0, 1, 1, 2, 3, 4, 6, 8, 16]),
                exp=e,
                order=rng.randint(0, 1000),
                priority=rng.randint(1, 99),
                weight=w,
                pool=rng.choice(["p1", "p2", ""]),
                max_slots=cap,
            )
        )
    pools = (PoolConfig("p1", scheduler, preemption), PoolConfig("p2", "priority", preemption))  # type: ignore[arg-type]
    return view(agents, pending, allocations, pools, default_pool="p1")


def shuffled(v: ClusterView, seed: int) -> ClusterView:
    rng = random.Random(seed)

    def mix(xs: Sequence[T]) -> tuple[T, ...]:
        out = list(xs)
        rng.shuffle(out)
        return tuple(out)

    agents = mix([Agent(a.id, a.resource_pool, mix(a.slots), a.enabled) for a in v.agents])
    return ClusterView(agents, mix(v.pending), mix(v.allocations), mix(v.pools), v.default_pool)


def check_invariants(v: ClusterView, out: list[Decision]) -> None:
    agents = {a.id: a for a in v.agents}
    usable = {(a.id, s.id) for a in v.agents if a.enabled for s in a.slots if s.enabled}
    taken = {(p.agent_id, s) for a in v.allocations for p in a.placements for s in p.slot_ids}
    pending = {r.request_id: r for r in v.pending}
    current = {a.request_id: a for a in v.allocations}
    held = Counter[str]()
    for a in v.allocations:
        held[a.experiment_id] += a.slots
    seen: set[str] = set()
    for d in out:
        assert d.request_id not in seen, "one decision per request"
        seen.add(d.request_id)
        if isinstance(d, Preempt):
            victim = current[d.request_id]
            assert victim.preemptible and not victim.preemption_requested
            continue
        r = pending[d.request_id]
        pool = r.resource_pool or v.default_pool
        assert sum(len(p.slot_ids) for p in d.placements) == r.slots_needed
        if r.slots_needed == 0:
            assert len(d.placements) == 1 and agents[d.placements[0].agent_id].enabled
            continue
        counts = {len(p.slot_ids) for p in d.placements}
        assert len(counts) == 1, "a gang is split evenly"
        assert len({p.agent_id for p in d.placements}) == len(d.placements)
        for p in d.placements:
            assert agents[p.agent_id].resource_pool == pool
            for s in p.slot_ids:
                assert (p.agent_id, s) in usable, "only enabled slots of enabled agents"
                assert (p.agent_id, s) not in taken, "a slot is never double-booked"
                taken.add((p.agent_id, s))
        held[r.experiment_id] += r.slots_needed
        if r.max_slots is not None:
            assert held[r.experiment_id] <= r.max_slots


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    preemption=st.booleans(),
    scheduler=st.sampled_from(["priority", "fair_share"]),
)
def test_random_clusters_keep_invariants_and_are_order_independent(
    seed: int, preemption: bool, scheduler: str
) -> None:
    """Random clusters: no over-/double-allocation, no disabled slot, even gangs, same output."""
    v = random_view(seed, preemption, scheduler)
    out = decide(v)
    check_invariants(v, out)
    assert decide(shuffled(v, seed)) == out
    assert decide(v) == out


def test_decisions_do_not_depend_on_the_hash_seed() -> None:
    """Interpreters with different PYTHONHASHSEED values make byte-identical decisions."""
    root = Path(__file__).resolve().parents[2]
    script = (
        "from tests.unit.test_scheduler_policy import random_view\n"
        "from services.scheduler.policy import decide\n"
        "for seed in range(150):\n"
        "    for pre in (False, True):\n"
        "        for sched in ('priority', 'fair_share'):\n"
        "            print(decide(random_view(seed, pre, sched)))\n"
    )
    outputs = set()
    for hash_seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(root)}
        proc = subprocess.run(
            [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        outputs.add(proc.stdout)
    assert len(outputs) == 1
