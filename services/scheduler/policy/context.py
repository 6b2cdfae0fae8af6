"""Per-pass working state shared by the policies (internal; mutable, never escapes ``decide``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from services.scheduler.policy.fit import Fit, FreeIndex
from services.scheduler.policy.state import (
    Allocate,
    Allocation,
    Decision,
    PendingRequest,
    Placement,
    PoolConfig,
    Preempt,
)


@dataclass
class PassState:
    """State shared by every pool in one pass: experiment holdings, caps and the output."""

    held: dict[str, int]
    """Experiment id -> slots held across all pools (current + decided in this pass)."""
    max_slots: dict[str, int | None]
    """Experiment id -> its cap (``None``: unlimited)."""
    decisions: list[Decision] = field(default_factory=list)

    def within_cap(self, req: PendingRequest) -> bool:
        """Return whether ``req`` can be given its slots without exceeding its experiment's cap."""
        cap = self.max_slots.get(req.experiment_id)
        return cap is None or self.held.get(req.experiment_id, 0) + req.slots_needed <= cap


@dataclass
class PoolState:
    """One pool's free-slot indexes, allocations and bookkeeping for the pass."""

    name: str
    config: PoolConfig
    index: FreeIndex
    """Slots free now."""
    allocations: list[Allocation]
    """Allocations of this pool, sorted by request id."""
    pending: list[PendingRequest]
    """Slot-needing requests of this pool, sorted by (priority, order, request id)."""
    future: FreeIndex | None = None
    """With preemption: slots free now plus slots of allocations asked to release that are not
    yet promised to a request ("soon free"). Every slot taken from :attr:`index` is taken here
    too."""
    victims: set[str] = field(default_factory=set)
    """Request ids of allocations already asked to release (before or during this pass)."""
    reserved: set[int] = field(default_factory=set)
    """Agent positions under a draining reservation (nothing is taken or preempted there)."""
    held: dict[str, int] = field(default_factory=dict)
    """Experiment id -> slots held in this pool (current + decided in this pass)."""
    failed_fit: set[int] = field(default_factory=set)
    """Gang sizes that did not fit; free capacity only shrinks within a pass, so they never will."""
    drained: bool = False
    """Whether a blocked request already got this pool's draining reservation."""

    def take(self, i: int, slots: Iterable[str]) -> None:
        """Take ``slots`` of agent ``i`` out of both indexes."""
        slots = tuple(slots)
        self.index.take(i, slots)
        if self.future is not None:
            self.future.take(i, slots)

    def try_fit(self, n: int) -> Fit | None:
        """Find a placement for ``n`` slots now (memoizing sizes that do not fit)."""
        if n in self.failed_fit:
            return None
        fit = self.index.find_gang(n)
        if fit is None:
            self.failed_fit.add(n)
        return fit

    def allocate(self, req: PendingRequest, fit: Fit, shared: PassState) -> None:
        """Take the slots of ``fit`` for ``req`` and emit the :class:`Allocate` decision."""
        placements: list[Placement] = []
        for i, k in fit:
            slots = self.index.choose_slots(i, k)
            self.take(i, slots)
            placements.append(Placement(self.index.ids[i], slots))
        placements.sort()
        self.charge(req.experiment_id, req.slots_needed, shared)
        shared.decisions.append(Allocate(req.request_id, tuple(placements)))

    def charge(self, experiment_id: str, n: int, shared: PassState) -> None:
        """Count ``n`` more slots as held by ``experiment_id`` (pool and cluster wide)."""
        self.held[experiment_id] = self.held.get(experiment_id, 0) + n
        shared.held[experiment_id] = shared.held.get(experiment_id, 0) + n

    def drain_for(self, n: int) -> None:
        """Give the pool's single draining reservation to a blocked gang of ``n`` slots.

        The reserved agents' free (and soon-free) slots are withheld from every later request
        of the pass, and their allocations are not preempted for them.
        """
        if self.drained:
            return
        self.drained = True
        for i in self.index.drain_targets(n):
            self.reserved.add(i)
            self.index.reserve_agent(i)
            if self.future is not None:
                self.future.reserve_agent(i)

    def preemptible(self, allocs: Iterable[Allocation]) -> list[Allocation]:
        """Filter ``allocs`` to those that may still be asked to release."""
        return [a for a in allocs if a.preemptible and a.request_id not in self.victims]


def emit_preempts(
    pool: PoolState, victims: list[Allocation], reason: str, shared: PassState
) -> None:
    """Emit :class:`Preempt` for ``victims`` and remember them."""
    for v in victims:
        pool.victims.add(v.request_id)
        shared.decisions.append(Preempt(v.request_id, reason))
