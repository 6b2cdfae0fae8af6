"""Weighted fair-share scheduling across the experiments of a pool.

1. **Shares** by water-filling (max-min fairness, progressive filling): every experiment with
   demand (slots held in the pool + slots of its placeable pending requests, capped by its
   ``max_slots``) gets capacity in proportion to its ``weight``, never more than its demand; what a
   saturated experiment does not need is refilled over the others. Fractional shares are rounded
   down and the leftover slots go one by one to the largest remainders (ties: experiment id),
   so the integer shares sum to ``min(capacity, total demand)``. Weights 1:3 on 8 slots -> 2:6.
2. **Deficit phase**: repeatedly the experiment with the largest deficit (share - held; ties:
   fewer held slots per weight, then experiment id) places its next request (by priority, then
   submit order) if that keeps it within its share and the gang fits now. An experiment holding
   nothing in the pool may exceed a share smaller than its gang, so big gangs are never starved by
   rounding. The first request that is within share but does not fit gets the pool's draining
   reservation (see :mod:`~services.scheduler.policy.priority`); with ``preemption: true`` it first
   tries to make room by preempting the newest allocations of experiments above their share, never
   taking one below its share (so two experiments cannot preempt each other back and forth).
3. **Backfill phase** (work conservation): slots still free after the deficit phase (gang shapes,
   rounding) go to the remaining requests, least-served experiment (held per weight) first.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from fractions import Fraction
from math import floor

from services.scheduler.policy.context import PassState, PoolState
from services.scheduler.policy.preemption import preempt_for
from services.scheduler.policy.state import Allocation, PendingRequest


def water_fill(
    demand: Mapping[str, int], weight: Mapping[str, Fraction], capacity: int
) -> dict[str, int]:
    """Divide ``capacity`` slots among experiments by weighted max-min fairness.

    Args:
        demand: Experiment id -> slots it could use (>= 0).
        weight: Experiment id -> weight (> 0) for every experiment in ``demand``.
        capacity: Slots to divide (>= 0).

    Returns:
        Experiment id -> integer share; each share <= its demand, and the shares sum to
        ``min(capacity, sum(demand))``.
    """
    exps = sorted(e for e, d in demand.items() if d > 0)
    shares = {e: 0 for e in demand}
    if sum(demand[e] for e in exps) <= capacity:
        shares.update({e: demand[e] for e in exps})
        return shares
    by_need = sorted(exps, key=lambda e: (Fraction(demand[e]) / weight[e], e))
    remaining = Fraction(capacity)
    wsum = sum((weight[e] for e in exps), Fraction(0))
    exact: dict[str, Fraction] = {}
    k = 0
    while k < len(by_need):
        e = by_need[k]
        if demand[e] > remaining * weight[e] / wsum:
            break
        exact[e] = Fraction(demand[e])
        remaining -= demand[e]
        wsum -= weight[e]
        k += 1
    for e in by_need[k:]:
        exact[e] = remaining * weight[e] / wsum
    for e, s in exact.items():
        shares[e] = floor(s)
    left = capacity - sum(shares.values())
    for e in sorted(exps, key=lambda e: (-(exact[e] - shares[e]), e)):
        if left <= 0:
            break
        if shares[e] < demand[e] and exact[e] > shares[e]:
            shares[e] += 1
            left -= 1
    return shares


def schedule_fair_share(
    pool: PoolState, shared: PassState, weights: Mapping[str, Fraction]
) -> None:
    """Run one fair-share pass over ``pool``, appending decisions to ``shared``.

    Args:
        pool: The pool's working state.
        shared: Pass-wide state (experiment holdings and caps, output).
        weights: Experiment id -> fair-share weight.
    """
    index = pool.index
    queues: dict[str, list[PendingRequest]] = {}
    for req in pool.pending:
        if index.feasible(req.slots_needed):
            queues.setdefault(req.experiment_id, []).append(req)
    exps = sorted(set(queues) | {e for e, h in pool.held.items() if h > 0})
    demand: dict[str, int] = {}
    for e in exps:
        here = pool.held.get(e, 0)
        want = here + sum(r.slots_needed for r in queues.get(e, ()))
        cap = shared.max_slots.get(e)
        if cap is not None:
            want = min(want, cap - (shared.held.get(e, 0) - here))
        demand[e] = max(here, want)
    weight = {e: weights.get(e, Fraction(1)) for e in exps}
    share = water_fill(demand, weight, index.capacity())

    def held(e: str) -> int:
        return pool.held.get(e, 0)

    # ---- deficit phase ------------------------------------------------------------------------
    ptr = dict.fromkeys(queues, 0)
    leftover: dict[str, list[PendingRequest]] = {e: [] for e in queues}
    heap = [(-(share[e] - held(e)), Fraction(held(e)) / weight[e], e) for e in queues]
    heap = [h for h in heap if h[0] < 0]
    heapq.heapify(heap)

    preempting = pool.config.preemption
    releasing: dict[str, int] = {}
    for a in pool.allocations:
        if a.request_id in pool.victims:
            releasing[a.experiment_id] = releasing.get(a.experiment_id, 0) + a.slots
    excess = {e: held(e) - share[e] for e in exps}
    by_exp: dict[str, list[Allocation]] = {}
    for a in pool.preemptible(pool.allocations):
        if excess.get(a.experiment_id, 0) > 0:
            by_exp.setdefault(a.experiment_id, []).append(a)
    donors = sorted(by_exp, key=lambda e: (-excess[e], e))
    for allocs in by_exp.values():
        allocs.sort(key=lambda a: (-a.order, a.request_id))  # newest first
    smallest = {e: min(a.slots for a in allocs) for e, allocs in by_exp.items()}
    start = dict.fromkeys(by_exp, 0)  # per donor: allocations before it are all victims
    failed_preempt: set[int] = set()

    def over_share(req: PendingRequest) -> Iterator[Allocation]:
        """Newest allocations of the most-over-share experiments, never dipping below share."""
        keep = {e: held(e) - releasing.get(e, 0) for e in donors}
        for e in donors:
            if e == req.experiment_id:
                continue
            allocs = by_exp[e]
            i = start[e]
            while i < len(allocs) and allocs[i].request_id in pool.victims:
                i += 1
            start[e] = i
            for j in range(i, len(allocs)):
                a = allocs[j]
                if keep[e] - smallest[e] < share[e]:
                    break
                if a.request_id not in pool.victims and keep[e] - a.slots >= share[e]:
                    keep[e] -= a.slots
                    yield a

    while heap:
        _, _, e = heapq.heappop(heap)
        queue = queues[e]
        progressed = False
        while ptr[e] < len(queue):
            req = queue[ptr[e]]
            ptr[e] += 1
            n = req.slots_needed
            if not shared.within_cap(req):
                continue
            within_share = held(e) + n <= share[e]
            if not within_share and held(e) > 0:
                leftover[e].append(req)
                continue
            fit = pool.try_fit(n)
            if fit is not None:
                pool.allocate(req, fit, shared)
                progressed = True
                break
            if preempting and within_share and n not in failed_preempt:
                reason = f"over fair share; preempted for {req.request_id}"
                victims = preempt_for(pool, req, over_share(req), reason, shared)
                if victims is not None:
                    for v in victims:
                        releasing[v.experiment_id] = releasing.get(v.experiment_id, 0) + v.slots
                    progressed = True
                    break
                failed_preempt.add(n)
            pool.drain_for(n)
            leftover[e].append(req)
        if progressed and share[e] > held(e) and ptr[e] < len(queue):
            heapq.heappush(heap, (-(share[e] - held(e)), Fraction(held(e)) / weight[e], e))

    # ---- backfill phase -----------------------------------------------------------------------
    rest = {
        e: sorted(
            leftover[e] + queues[e][ptr[e] :], key=lambda r: (r.priority, r.order, r.request_id)
        )
        for e in queues
    }
    ptr2 = dict.fromkeys(rest, 0)
    heap2 = [(Fraction(held(e)) / weight[e], e) for e in rest if rest[e]]
    heapq.heapify(heap2)
    while heap2:
        _, e = heapq.heappop(heap2)
        queue = rest[e]
        while ptr2[e] < len(queue):
            req = queue[ptr2[e]]
            ptr2[e] += 1
            if not shared.within_cap(req):
                continue
            fit = pool.try_fit(req.slots_needed)
            if fit is not None:
                pool.allocate(req, fit, shared)
                if ptr2[e] < len(queue):
                    heapq.heappush(heap2, (Fraction(held(e)) / weight[e], e))
                break
