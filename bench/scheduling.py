"""Scheduling at scale: one pass of the scheduling policy over a big cluster.

The cluster is 1,000 agents of 8 CPU slots in 4 pools (two scheduled by priority, two by fair
share), half its slots held by running gangs, and ``N`` pending requests (1k, 10k, 100k) of 400
experiments: priorities 1-99, gangs of 1, 2, 4, 8 or 16 slots, every tenth experiment capped by
``max_slots``. A pass is :func:`services.scheduler.policy.decide` on that view: what the
scheduler runs on every catch-up (it ticks every second; Determined's ticks every 500 ms). The
target is a pass in at most 100 ms at 10k pending; the figure is passes per second beside that
target's 10 per second, and the cost curve over ``N`` is in the details. CPU time, in memory,
seeded (the same view every run).
"""

from __future__ import annotations

import random
import time

from bench.common import BenchContext, Measure, Report, progress
from services.scheduler.policy import decide
from services.scheduler.policy.state import (
    Agent,
    Allocation,
    ClusterView,
    PendingRequest,
    Placement,
    PoolConfig,
    Slot,
)

AGENTS = 1000
SLOTS_PER_AGENT = 8
POOLS = ("gpu-a", "gpu-b", "cpu-a", "cpu-b")
FAIR_SHARE = ("gpu-b", "cpu-b")
GANGS = (1, 1, 1, 2, 2, 4, 4, 8, 16)
TARGET_SECONDS = 0.1
"""The goal: one pass at 10k pending in at most this."""


def cluster_view(pending: int, seed: int = 7) -> ClusterView:
    """The view described in the module: ``pending`` requests over 1,000 half-busy agents."""
    rng = random.Random(seed)
    agents = tuple(
        Agent(
            id=f"agent-{i:04d}",
            resource_pool=POOLS[i % len(POOLS)],
            slots=tuple(Slot(f"{i}-{s}", device_type="cpu") for s in range(SLOTS_PER_AGENT)),
        )
        for i in range(AGENTS)
    )
    allocations = []
    for i, agent in enumerate(agents):
        held = SLOTS_PER_AGENT // 2
        allocations.append(
            Allocation(
                request_id=f"run-{i}",
                experiment_id=f"exp-{i % 400}",
                placements=(Placement(agent.id, tuple(s.id for s in agent.slots[:held])),),
                resource_pool=agent.resource_pool,
                priority=rng.randint(1, 99),
                order=i,
            )
        )
    requests = tuple(
        PendingRequest(
            request_id=f"req-{n}",
            experiment_id=f"exp-{n % 400}",
            slots_needed=rng.choice(GANGS),
            order=AGENTS + n,
            priority=rng.randint(1, 99),
            weight=float(1 + n % 3),
            resource_pool=POOLS[n % len(POOLS)],
            max_slots=64 if (n % 400) % 10 == 0 else None,
        )
        for n in range(pending)
    )
    return ClusterView(
        agents=agents,
        pending=requests,
        allocations=tuple(allocations),
        pools=tuple(
            PoolConfig(name=p, scheduler="fair_share" if p in FAIR_SHARE else "priority")
            for p in POOLS
        ),
        default_pool=POOLS[0],
    )


def pass_seconds(view: ClusterView, repeat: int) -> tuple[float, int]:
    """The best CPU time of ``repeat`` passes over ``view``, and the decisions of one."""
    best = float("inf")
    decisions = 0
    for _ in range(repeat):
        started = time.process_time()
        decisions = len(decide(view))
        best = min(best, time.process_time() - started)
    return best, decisions


async def run(ctx: BenchContext) -> Report:
    """Times one scheduling pass at 1k, 10k and 100k pending requests."""
    report = Report()
    curve: dict[str, dict[str, float]] = {}
    for pending in (1_000, 10_000, ctx.scaled(100_000, minimum=10_000)):
        view = cluster_view(pending)
        seconds, decisions = pass_seconds(view, repeat=3 if pending <= 10_000 else 1)
        progress(
            f"scheduling pass: {pending:,} pending, {AGENTS:,} agents: {1e3 * seconds:.1f} ms "
            f"({decisions:,} decisions)"
        )
        curve[str(pending)] = {"ms": round(1e3 * seconds, 2), "decisions": decisions}
        if pending == 10_000:
            report.measures.append(
                Measure(
                    f"scheduling pass {pending:,} pending",
                    1.0 / seconds,
                    1.0 / TARGET_SECONDS,
                    "target: 100 ms a pass",
                    unit="passes/s",
                    count=pending,
                    notes=f"{AGENTS:,} agents x {SLOTS_PER_AGENT} slots, 4 pools, CPU time",
                    target="<= 100 ms a pass",
                    met=seconds <= TARGET_SECONDS,
                )
            )
    report.details["pass_ms_by_pending"] = curve
    return report
