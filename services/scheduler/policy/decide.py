"""The policy's entry point: one deterministic scheduling pass over a :class:`ClusterView`."""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from fractions import Fraction

from services.scheduler.policy.context import PassState, PoolState
from services.scheduler.policy.fair_share import schedule_fair_share
from services.scheduler.policy.fit import FreeIndex
from services.scheduler.policy.priority import schedule_priority
from services.scheduler.policy.state import (
    Allocate,
    Allocation,
    ClusterView,
    Decision,
    PendingRequest,
    Placement,
    PoolConfig,
)


def _request_key(req: PendingRequest) -> tuple[int, int, str]:
    return (req.priority, req.order, req.request_id)


def _check_unique(kind: str, ids: Iterable[str]) -> None:
    seen: set[str] = set()
    dups = sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    if dups:
        raise ValueError(f"duplicate {kind}: {', '.join(dups[:5])}")


def decide(view: ClusterView) -> list[Decision]:
    """Decide which pending requests to allocate and which allocations to preempt now.

    Pure and deterministic: no clock, RNG or I/O, and the result does not depend on the order of
    the view's tuples. Pools are processed in name order; within a pool, zero-slot admissions come
    first, then the pool's scheduler (``priority`` or ``fair_share``) in the order it decided.

    Args:
        view: Agents, pending requests, current allocations and pool settings.

    Returns:
        :class:`Allocate` and :class:`Preempt` decisions, to be applied in order.

    Raises:
        ValueError: If agent ids, pool names, pending or allocation request ids repeat.
    """
    _check_unique("agent ids", (a.id for a in view.agents))
    _check_unique("pool names", (p.name for p in view.pools))
    _check_unique("pending request ids", (r.request_id for r in view.pending))
    _check_unique("allocation request ids", (a.request_id for a in view.allocations))

    default = view.default_pool
    aux = view.default_aux_pool or default
    configs = {p.name: p for p in view.pools}
    allocations = sorted(view.allocations, key=lambda a: a.request_id)
    allocated = {a.request_id for a in allocations}
    pending = sorted((r for r in view.pending if r.request_id not in allocated), key=_request_key)

    # Slots held, per agent; zero-slot tasks, per agent.
    busy: dict[str, set[str]] = {}
    staying: dict[str, set[str]] = {}  # held by allocations not asked to release
    zero_load: dict[str, int] = {}
    for alloc in allocations:
        for agent_id, slot_ids in alloc.placements:
            busy.setdefault(agent_id, set()).update(slot_ids)
            if not alloc.preemption_requested:
                staying.setdefault(agent_id, set()).update(slot_ids)
        if alloc.slots == 0:
            for agent_id, _ in alloc.placements:
                zero_load[agent_id] = zero_load.get(agent_id, 0) + 1

    # Usable slots (enabled slots of enabled agents), per pool.
    usable: dict[str, dict[str, list[str]]] = {}
    for agent in view.agents:
        if agent.enabled:
            pool_name = agent.resource_pool or default
            usable.setdefault(pool_name, {})[agent.id] = [s.id for s in agent.slots if s.enabled]

    # Experiment settings: from its most recent pending request, else its newest allocation.
    held: dict[str, int] = {}
    weights: dict[str, Fraction] = {}
    for alloc in sorted(allocations, key=lambda a: (a.order, a.request_id)):
        held[alloc.experiment_id] = held.get(alloc.experiment_id, 0) + alloc.slots
        weights[alloc.experiment_id] = Fraction(alloc.weight)
    max_slots: dict[str, int | None] = {}
    for req in sorted(pending, key=lambda r: (r.order, r.request_id)):
        weights[req.experiment_id] = Fraction(req.weight)
        max_slots[req.experiment_id] = req.max_slots
    shared = PassState(held=held, max_slots=max_slots)

    slot_reqs: dict[str, list[PendingRequest]] = {}
    zero_reqs: dict[str, list[PendingRequest]] = {}
    for req in pending:
        if req.slots_needed:
            slot_reqs.setdefault(req.resource_pool or default, []).append(req)
        else:
            zero_reqs.setdefault(req.resource_pool or aux, []).append(req)
    pool_allocs: dict[str, list[Allocation]] = {}
    for alloc in allocations:
        if alloc.slots:
            pool_allocs.setdefault(alloc.resource_pool or default, []).append(alloc)

    for name in sorted(set(slot_reqs) | set(zero_reqs)):
        config = configs.get(name, PoolConfig(name))
        agents = usable.get(name, {})
        if name in zero_reqs:
            _admit_zero_slot(zero_reqs[name], sorted(agents), zero_load, config, shared)
        if name not in slot_reqs:
            continue
        pool = PoolState(
            name=name,
            config=config,
            index=FreeIndex(agents, busy),
            allocations=pool_allocs.get(name, []),
            pending=slot_reqs[name],
            future=FreeIndex(agents, staying) if config.preemption else None,
        )
        for alloc in pool.allocations:
            pool.held[alloc.experiment_id] = pool.held.get(alloc.experiment_id, 0) + alloc.slots
            if alloc.preemption_requested:
                pool.victims.add(alloc.request_id)
        if config.scheduler == "fair_share":
            schedule_fair_share(pool, shared, weights)
        else:
            schedule_priority(pool, shared)
    return shared.decisions


def _admit_zero_slot(
    reqs: list[PendingRequest],
    agent_ids: list[str],
    load: dict[str, int],
    config: PoolConfig,
    shared: PassState,
) -> None:
    """Place zero-slot tasks on the pool's least-loaded enabled agent (ties: agent id).

    They need no slot, so they never wait for capacity; they wait only when the pool has no
    enabled agent, or every agent is at ``max_zero_slot_tasks_per_agent``.
    """
    limit = config.max_zero_slot_tasks_per_agent
    heap = [(load.get(a, 0), a) for a in agent_ids]
    heap = [h for h in heap if limit is None or h[0] < limit]
    heapq.heapify(heap)
    for req in reqs:
        if not heap:
            return
        n, agent_id = heapq.heappop(heap)
        shared.decisions.append(Allocate(req.request_id, (Placement(agent_id, ()),)))
        load[agent_id] = n + 1
        if limit is None or n + 1 < limit:
            heapq.heappush(heap, (n + 1, agent_id))
