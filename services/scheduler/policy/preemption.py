"""Making room for a blocked gang by asking running allocations to release their slots.

The plan is computed on a hypothetical copy of the free index (slots given back, then taken away
again): first the slots of allocations already asked to release and not yet promised to anyone
("soon free"), then candidates one at a time in the caller's order, until the gang fits. Only the
candidates whose slots the resulting placement actually uses are preempted; the placement's slots
are then promised to the request for the rest of the pass (free ones are reserved, soon-free ones
claimed), so nobody else is given the freed capacity and later passes never preempt twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from services.scheduler.policy.context import PassState, PoolState, emit_preempts
from services.scheduler.policy.state import Allocation, PendingRequest

_SOON_FREE_RANK = 0
_VICTIM_RANK_BASE = 2  # free slots rank 1 (the default of FreeIndex.choose_slots)


def preempt_for(
    pool: PoolState,
    req: PendingRequest,
    candidates: Iterable[Allocation],
    reason: str,
    shared: PassState,
) -> list[Allocation] | None:
    """Promise ``req`` a placement made of free, soon-free and newly preempted slots.

    Args:
        pool: The pool's working state (its index is restored before returning).
        req: The blocked request.
        candidates: Allocations that may be preempted, most preemptable first; consumed lazily.
        reason: Reason recorded on each :class:`Preempt`.
        shared: Pass-wide state receiving the decisions.

    Returns:
        The allocations preempted (possibly none) if ``req`` now has a promised placement, else
        ``None``.
    """
    index = pool.index
    n = req.slots_needed
    given: list[tuple[int, list[str]]] = []
    rank: dict[int, dict[str, int]] = {}

    def give(i: int, slots: Iterable[str], r: int) -> None:
        added = index.give(i, sorted(slots))
        if added:
            given.append((i, added))
            ranks = rank.setdefault(i, {})
            for s in added:
                ranks[s] = r

    for i in sorted(pool.soon_free):
        give(i, pool.soon_free[i], _SOON_FREE_RANK)
    fit = index.find_gang(n)
    chosen: list[Allocation] = []
    if fit is None:
        for alloc in candidates:
            r = _VICTIM_RANK_BASE + len(chosen)
            for agent_id, slot_ids in alloc.placements:
                pos = index.position(agent_id)
                if pos is not None:
                    give(pos, slot_ids, r)
            chosen.append(alloc)
            fit = index.find_gang(n)
            if fit is not None:
                break
    placement = [] if fit is None else [(i, index.choose_slots(i, k, rank.get(i))) for i, k in fit]
    for i, added in reversed(given):
        index.take(i, added)
    if fit is None:
        return None

    used = frozenset((index.ids[i], s) for i, slots in placement for s in slots)
    needed = [
        a
        for a in chosen
        if any((agent_id, s) in used for agent_id, slot_ids in a.placements for s in slot_ids)
    ]
    for i, slots in placement:
        index.take(i, slots)
        soon = pool.soon_free.get(i)
        if soon is not None:
            soon.difference_update(slots)
            if not soon:
                del pool.soon_free[i]
    for victim in needed:
        pool.add_soon_free(victim, exclude=used)
    pool.charge(req.experiment_id, n, shared)
    emit_preempts(pool, needed, reason, shared)
    return needed
