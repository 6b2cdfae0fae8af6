"""Priority scheduling with optional preemption and starvation-free backfill.

Requests are visited in ``(priority, order, request_id)`` order: lower priority number first, FIFO
by submit order within a priority. For each request that is within its experiment's ``max_slots``
and could ever fit in the pool:

1. If its gang fits now it is allocated (best fit, see :mod:`~services.scheduler.policy.fit`).
2. Else, when the pool has ``preemption: true``, it is promised the slots of allocations already
   asked to release plus, if still short, those of strictly lower-priority (higher number)
   preemptible allocations, lowest priority first, then newest (largest ``order``), then request id.
   Only allocations whose slots the placement uses are preempted, and the promised slots are
   withheld from every other request in the pass.
3. Else the first such blocked request of the pool gets a *draining reservation*: the agents it
   would eventually fit on (most free slots first) are withheld from everyone after it in this
   pass, so they only drain. Later, smaller requests may **backfill** the rest of the pool. Because
   the reserved agents never lose free slots while reserved, and the target only moves to agents
   at least as close to fitting (ties to a smaller id), the blocked request's best achievable fit
   never regresses and it runs once enough of the drained allocations finish: backfill cannot
   starve it (only more important requests can delay it, by design). Other blocked requests wait
   their turn to be first.

Requests over their experiment's cap, or bigger than the pool can ever hold, are skipped without
blocking anyone.
"""

from __future__ import annotations

from collections.abc import Iterator

from services.scheduler.policy.context import PassState, PoolState
from services.scheduler.policy.preemption import preempt_for
from services.scheduler.policy.state import Allocation, PendingRequest


def victim_order(alloc: Allocation) -> tuple[int, int, str]:
    """Sort key putting the most preemptable allocation first: lowest priority, then newest."""
    return (-alloc.priority, -alloc.order, alloc.request_id)


def schedule_priority(pool: PoolState, shared: PassState) -> None:
    """Run one priority-scheduling pass over ``pool``, appending decisions to ``shared``."""
    preempting = pool.config.preemption
    candidates = sorted(pool.preemptible(pool.allocations), key=victim_order) if preempting else []
    failed_preempt: set[int] = set()
    start = 0  # candidates before this index are all victims already

    def eligible(req: PendingRequest) -> Iterator[Allocation]:
        nonlocal start
        while start < len(candidates) and candidates[start].request_id in pool.victims:
            start += 1
        for j in range(start, len(candidates)):
            alloc = candidates[j]
            if alloc.priority <= req.priority:
                return  # sorted by priority descending: nothing less important remains
            if alloc.request_id not in pool.victims:
                yield alloc

    for req in pool.pending:
        n = req.slots_needed
        if not shared.within_cap(req) or not pool.index.feasible(n):
            continue
        fit = pool.try_fit(n)
        if fit is not None:
            pool.allocate(req, fit, shared)
            continue
        # Candidates only shrink along the pass (later requests are less important and the free
        # set only shrinks), so a size that cannot be made room for never can again.
        if preempting and n not in failed_preempt:
            reason = f"preempted for {req.request_id} (priority {req.priority})"
            if preempt_for(pool, req, eligible(req), reason, shared) is not None:
                continue
            failed_preempt.add(n)
        pool.drain_for(n)
