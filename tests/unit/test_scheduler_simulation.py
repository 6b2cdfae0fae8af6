"""Scale and liveness tests of the scheduling policy: repeated passes over a simulated cluster."""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from services.scheduler.policy import (
    Agent,
    Allocate,
    Allocation,
    ClusterView,
    PendingRequest,
    Placement,
    PoolConfig,
    Preempt,
    Slot,
    decide,
)

SLOTS_PER_AGENT = 8


def make_agents(n: int, rng: random.Random, pools: tuple[str, ...]) -> tuple[Agent, ...]:
    """``n`` 8-slot agents spread over ``pools``; ~1% disabled agents, ~1% disabled slots."""
    agents = []
    for i in range(n):
        slots = tuple(
            Slot(f"gpu{j}", enabled=rng.random() > 0.01, device_type="cuda")
            for j in range(SLOTS_PER_AGENT)
        )
        agents.append(Agent(f"agent-{i:04d}", pools[i % len(pools)], slots, rng.random() > 0.01))
    return tuple(agents)


# (experiment, pool, slots per trial, priority, weight, max_slots)
EXPERIMENTS = [
    ("p-urgent", "prio", 1, 10, 1.0, None),
    ("p-dist16", "prio", 16, 30, 1.0, None),
    ("p-dist8", "prio", 8, 42, 1.0, None),
    ("p-quad", "prio", 4, 42, 1.0, None),
    ("p-pair", "prio", 2, 60, 1.0, None),
    ("p-bulk", "prio", 1, 80, 1.0, None),
    ("f-light", "fair", 1, 42, 1.0, None),
    ("f-heavy", "fair", 1, 42, 3.0, None),
    ("f-pair", "fair", 2, 42, 2.0, None),
    ("f-quad", "fair", 4, 42, 1.0, 64),
    ("f-dist8", "fair", 8, 42, 5.0, None),
]


@dataclass
class Sim:
    """A toy cluster that applies decisions, completes work and re-queues preempted trials."""

    agents: tuple[Agent, ...]
    pools: tuple[PoolConfig, ...]
    rng: random.Random
    pending: dict[str, PendingRequest] = field(default_factory=dict)
    running: dict[str, Allocation] = field(default_factory=dict)
    occupied: dict[tuple[str, str], str] = field(default_factory=dict)
    trial_of: dict[str, str] = field(default_factory=dict)
    completed: Counter[str] = field(default_factory=Counter)
    allocated_ids: set[str] = field(default_factory=set)
    preempted: int = 0
    order: int = 0
    longest_decide: float = 0.0

    def submit(
        self, trial: str, exp: str, pool: str, n: int, prio: int, w: float, cap: int | None
    ) -> None:
        """Queue a new request for ``trial`` (a fresh request id, the next order key)."""
        rid = f"{trial}#{self.order}"
        self.order += 1
        self.trial_of[rid] = trial
        self.pending[rid] = PendingRequest(
            rid, exp, n, self.order, None, prio, w, pool, cap, preemptible=True
        )

    def step(self) -> None:
        """One pass: decide, check and apply every decision, then let time advance."""
        view = ClusterView(
            self.agents,
            tuple(self.pending.values()),
            tuple(self.running.values()),
            self.pools,
            default_pool="prio",
        )
        t0 = time.perf_counter()
        decisions = decide(view)
        self.longest_decide = max(self.longest_decide, time.perf_counter() - t0)
        usable = self.usable
        for d in decisions:
            if isinstance(d, Preempt):
                victim = self.running[d.request_id]
                assert not victim.preemption_requested, "never preempted twice"
                self.running[d.request_id] = dataclasses.replace(victim, preemption_requested=True)
                self.preempted += 1
                continue
            assert isinstance(d, Allocate)
            req = self.pending.pop(d.request_id)
            assert d.request_id not in self.allocated_ids, "each request runs once"
            self.allocated_ids.add(d.request_id)
            assert d.slots == req.slots_needed
            assert len({len(p.slot_ids) for p in d.placements}) == 1, "even gang split"
            for agent_id, slot_ids in d.placements:
                for s in slot_ids:
                    key = (agent_id, s)
                    assert key in usable[req.resource_pool], "usable slot of the right pool"
                    assert key not in self.occupied, "no slot is double-booked"
                    self.occupied[key] = d.request_id
            self.running[d.request_id] = Allocation(
                d.request_id,
                req.experiment_id,
                d.placements,
                req.resource_pool,
                req.priority,
                req.order,
                req.preemptible,
                False,
                req.weight,
            )
        held = Counter[str]()
        for a in self.running.values():
            held[a.experiment_id] += a.slots
        for exp, *_rest, cap in EXPERIMENTS:
            if cap is not None:
                assert held[exp] <= cap, "max_slots respected"
        self.progress()

    def progress(self) -> None:
        """Preempted allocations release and re-queue; others complete with some probability."""
        for rid in sorted(self.running):
            a = self.running[rid]
            if a.preemption_requested:
                self.release(a)
                req_trial = self.trial_of[rid]
                exp = next(e for e in EXPERIMENTS if e[0] == a.experiment_id)
                self.submit(req_trial, exp[0], exp[1], a.slots, exp[3], exp[4], exp[5])
            elif self.rng.random() < 0.35:
                self.release(a)
                self.completed[self.trial_of[rid]] += 1

    def release(self, a: Allocation) -> None:
        del self.running[a.request_id]
        for agent_id, slot_ids in a.placements:
            for s in slot_ids:
                assert self.occupied.pop((agent_id, s)) == a.request_id

    def __post_init__(self) -> None:
        self.usable: dict[str, set[tuple[str, str]]] = {}
        for ag in self.agents:
            bucket = self.usable.setdefault(ag.resource_pool, set())
            if ag.enabled:
                bucket.update((ag.id, s.id) for s in ag.slots if s.enabled)


def big_view(rng: random.Random) -> ClusterView:
    """1,000 agents, 10,000 pending trials, half the priority pool busy with low-priority work."""
    pools = (PoolConfig("prio", "priority", preemption=True), PoolConfig("fair", "fair_share"))
    agents = make_agents(1000, rng, ("prio", "fair"))
    running = []
    for i, ag in enumerate(agents[:400:2]):
        slots = tuple(s.id for s in ag.slots if s.enabled)
        running.append(Allocation(f"old-{i}", "p-bulk", (Placement(ag.id, slots),), "prio", 80, i))
    pending = []
    for k in range(10_000):
        exp, pool, n, prio, w, cap = EXPERIMENTS[k % len(EXPERIMENTS)]
        pending.append(PendingRequest(f"r{k:05d}", exp, n, 1000 + k, k, prio, w, pool, cap))
    rng.shuffle(pending)
    return ClusterView(agents, tuple(pending), tuple(running), pools, default_pool="prio")


def test_single_decide_10k_trials_on_1k_agents_allocates_and_preempts() -> None:
    """One decide over 10,000 pending trials and 1,000 agents fills hundreds of slots and
    preempts low-priority work."""
    view = big_view(random.Random(7))
    out = decide(view)
    assert sum(isinstance(d, Allocate) for d in out) > 500
    assert any(isinstance(d, Preempt) for d in out)


def test_simulation_runs_every_trial_exactly_once_without_double_booking() -> None:
    """10,000 trials on 1,000 agents: every trial completes exactly once, no slot double-booked."""
    rng = random.Random(2024)
    pools = (PoolConfig("prio", "priority", preemption=True), PoolConfig("fair", "fair_share"))
    sim = Sim(make_agents(1000, rng, ("prio", "fair")), pools, rng)
    trials = []
    for k in range(10_000):
        exp, pool, n, prio, w, cap = EXPERIMENTS[k % len(EXPERIMENTS)]
        trials.append((f"t{k:05d}", exp, pool, n, prio, w, cap))
    rng.shuffle(trials)
    waves = [trials[i::5] for i in range(5)]
    zero_slot = [f"z{i}" for i in range(50)]
    for z in zero_slot:
        sim.submit(z, "tensorboards", "fair", 0, 42, 1.0, None)
    steps = 0
    t0 = time.perf_counter()
    while steps < 5 or sim.pending or sim.running:
        if steps < 5:
            for t in waves[steps]:
                sim.submit(*t)
        sim.step()
        steps += 1
        assert steps < 400, "the simulation must terminate"
    elapsed = time.perf_counter() - t0
    print(
        f"simulation: {steps} passes, {sim.preempted} preemptions, {elapsed:.1f} s, "
        f"slowest decide {sim.longest_decide * 1000:.0f} ms"
    )
    assert set(sim.completed) == {t[0] for t in trials} | set(zero_slot)
    assert all(c == 1 for c in sim.completed.values())
    assert sim.preempted > 0


def test_blocked_gang_is_not_starved_by_a_stream_of_small_requests() -> None:
    """Backfill never starves a blocked gang: it runs while small requests keep arriving."""
    rng = random.Random(5)
    pools = (PoolConfig("prio", "priority"),)
    sim = Sim(
        tuple(Agent(f"a{i}", "prio", tuple(Slot(f"s{j}") for j in range(4))) for i in range(4)),
        pools,
        rng,
    )
    for k in range(16):
        sim.submit(f"small{k}", "p-bulk", "prio", 1, 42, 1.0, None)
    sim.step()
    sim.submit("gang", "p-dist8", "prio", 8, 42, 1.0, None)
    for k in range(16, 400):
        sim.submit(f"small{k}", "p-bulk", "prio", 1, 42, 1.0, None)
        sim.step()
        if "gang" in sim.completed or any(sim.trial_of[r] == "gang" for r in sim.running):
            break
    else:
        raise AssertionError("the gang never ran")
