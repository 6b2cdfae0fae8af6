"""Making room for a blocked gang by asking running allocations to release their slots.

The plan is computed on the pool's *future* index (free slots plus the slots of allocations already
asked to release that nobody was promised yet, "soon free"): if the gang does not fit there,
candidates' slots are added one allocation at a time in the caller's order until it does (and
taken away again afterwards). Only the
candidates whose slots the resulting placement actually uses are preempted; the placement's slots
are then promised to the request for the rest of the pass (free ones are reserved, soon-free ones
claimed), so nobody else is given the freed capacity and later passes never preempt twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.scheduler.policy.context import PassState, PoolState, emit_preempts
from services.scheduler.policy.state import Allocation, PendingRequest

_SOON_FREE_RANK = 0
_FREE_RANK = 1
_VICTIM_RANK_BASE = 2


def preempt_for(
    pool: PoolState,
    req: PendingRequest,
    candidates: Iterable[Allocation],
    reason: str,
    shared: PassState,
) -> list[Allocation] | None:
    """Promise ``req`` a placement made of free, soon-free and newly preempted slots.

    Args:
        pool: The pool's working state; needs :attr:`PoolState.future` (preemption enabled).
        req: The blocked request.
        candidates: Allocations that may be preempted, most preemptable first; consumed lazily.
        reason: Reason recorded on each :class:`Preempt`.
        shared: Pass-wide state receiving the decisions.

    Returns:
        The allocations preempted (possibly none) if ``req`` now has a promised placement, else
        ``None``.
    """
    future = pool.future
    if future is None:
        return None
    n = req.slots_needed
    given: list[tuple[int, list[str]]] = []
    victim_rank: dict[tuple[int, str], int] = {}
    chosen: list[Allocation] = []
    fit = future.find_gang(n)
    if fit is None:
        for alloc in candidates:
            r = _VICTIM_RANK_BASE + len(chosen)
            for agent_id, slot_ids in alloc.placements:
                pos = future.position(agent_id)
                if pos is None or pos in pool.reserved:
                    continue
                added = future.give(pos, sorted(slot_ids))
                if added:
                    given.append((pos, added))
                    for slot in added:
                        victim_rank[(pos, slot)] = r
            chosen.append(alloc)
            fit = future.find_gang(n)
            if fit is not None:
                break
    placement: list[tuple[int, tuple[str, ...]]] = []
    for i, k in fit or ():
        free_now = pool.index.free_slots(i)
        rank = {
            slot: victim_rank.get((i, slot), _FREE_RANK if slot in free_now else _SOON_FREE_RANK)
            for slot in future.free_slots(i)
        }
        placement.append((i, future.choose_slots(i, k, rank)))
    for i, added in reversed(given):
        future.take(i, added)
    if fit is None:
        return None

    used = frozenset((future.ids[i], slot) for i, slots in placement for slot in slots)
    needed = [
        a
        for a in chosen
        if any((agent_id, s) in used for agent_id, slot_ids in a.placements for s in slot_ids)
    ]
    for i, slots in placement:
        pool.take(i, slots)
    for victim in needed:
        for agent_id, slot_ids in victim.placements:
            pos = future.position(agent_id)
            if pos is not None and pos not in pool.reserved:
                future.give(pos, sorted(s for s in slot_ids if (agent_id, s) not in used))
    pool.charge(req.experiment_id, n, shared)
    emit_preempts(pool, needed, reason, shared)
    return needed
