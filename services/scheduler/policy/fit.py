"""Gang placement over one pool's free slots, indexed by free count.

A request of ``n`` slots is placed all at once or not at all:

1. **Single agent, best fit**: the agent with the fewest free slots that still has ``>= n``
   (ties: smallest agent id).
2. **Even split** (Determined's multi-agent rule): ``k >= 2`` agents with ``p = n / k`` slots each,
   trying the largest ``p`` (fewest agents) first and best fit per agent (agents with the fewest
   free slots ``>= p``, ties by agent id).
3. Otherwise the request waits.

Agents are kept in per-free-count buckets (a lazy min-heap of agent positions per count), so a
placement costs ``O(max_slots_per_agent + log agents)`` instead of a scan of every agent.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

Fit = list[tuple[int, int]]
"""A gang placement: (agent position, slots to take there) pairs."""


@lru_cache(maxsize=1024)
def split_sizes(n: int) -> tuple[int, ...]:
    """Per-agent slot counts ``p`` that split ``n`` evenly over two or more agents, largest first.

    Args:
        n: Gang size.

    Returns:
        Every divisor ``p`` of ``n`` with ``p < n``, in descending order.
    """
    return tuple(p for p in range(n // 2, 0, -1) if n % p == 0)


class FreeIndex:
    """Mutable index of one pool's usable free slots, bucketed by each agent's free count.

    Agents are addressed by position in ascending agent-id order, so "smallest position" is
    "smallest agent id". Only enabled slots of enabled agents are ever in the index.
    """

    __slots__ = (
        "_buckets",
        "_caps",
        "_count",
        "_feasible",
        "_free",
        "_pos",
        "_size",
        "_sorted_caps",
        "ids",
        "usable",
    )

    def __init__(self, usable: Mapping[str, Sequence[str]], busy: Mapping[str, Iterable[str]]):
        """Build the index.

        Args:
            usable: Agent id -> its usable (enabled) slot ids, for enabled agents of the pool.
            busy: Agent id -> slot ids held by current allocations.
        """
        self.ids: list[str] = sorted(usable)
        self._pos: dict[str, int] = {a: i for i, a in enumerate(self.ids)}
        self.usable: list[frozenset[str]] = [frozenset(usable[a]) for a in self.ids]
        self._free: list[set[str]] = [
            set(u.difference(busy.get(a, ()))) for a, u in zip(self.ids, self.usable, strict=True)
        ]
        self._caps: list[int] = [len(u) for u in self.usable]
        self._sorted_caps: list[int] = sorted(self._caps)
        top = max(self._caps, default=0)
        self._count: list[int] = [len(f) for f in self._free]
        self._size: list[int] = [0] * (top + 1)
        self._buckets: list[list[int]] = [[] for _ in range(top + 1)]
        for i, c in enumerate(self._count):
            self._size[c] += 1
            if c:
                self._buckets[c].append(i)  # ascending positions: already a heap
        self._feasible: dict[int, bool] = {}

    # ---- lookups -------------------------------------------------------------------------------

    def position(self, agent_id: str) -> int | None:
        """Return the position of ``agent_id``, or ``None`` if it is not usable in this pool."""
        return self._pos.get(agent_id)

    def free_slots(self, i: int) -> frozenset[str]:
        """Return the free slot ids of agent ``i``."""
        return frozenset(self._free[i])

    def capacity(self) -> int:
        """Return the number of usable slots in the pool (free or not)."""
        return sum(self._caps)

    # ---- mutation ------------------------------------------------------------------------------

    def _set_count(self, i: int, new: int) -> None:
        old = self._count[i]
        if old == new:
            return
        self._size[old] -= 1
        self._size[new] += 1
        self._count[i] = new
        if new:
            heapq.heappush(self._buckets[new], i)

    def take(self, i: int, slots: Iterable[str]) -> None:
        """Mark ``slots`` of agent ``i`` as not free (missing ones are ignored)."""
        free = self._free[i]
        free.difference_update(slots)
        self._set_count(i, len(free))

    def give(self, i: int, slots: Iterable[str]) -> list[str]:
        """Mark usable, currently busy ``slots`` of agent ``i`` as free.

        Returns:
            The slot ids that actually became free (to undo with :meth:`take`).
        """
        free = self._free[i]
        usable = self.usable[i]
        added = [s for s in slots if s in usable and s not in free]
        if added:
            free.update(added)
            self._set_count(i, len(free))
        return added

    # ---- placement -----------------------------------------------------------------------------

    def _valid_top(self, c: int) -> int:
        heap = self._buckets[c]
        count = self._count
        while count[heap[0]] != c:
            heapq.heappop(heap)
        return heap[0]

    def _at_least(self, p: int) -> int:
        return sum(self._size[p:])

    def _select(self, p: int, k: int) -> list[int]:
        """Pop the best-fit ``k`` agents with ``>= p`` free (caller checked they exist)."""
        chosen: list[int] = []
        seen: set[int] = set()
        count = self._count
        for c in range(p, len(self._size)):
            if len(chosen) == k:
                break
            if not self._size[c]:
                continue
            heap = self._buckets[c]
            taken_here: list[int] = []
            need = min(k - len(chosen), self._size[c])
            while len(taken_here) < need:
                i = heapq.heappop(heap)
                if count[i] == c and i not in seen:
                    seen.add(i)
                    taken_here.append(i)
            for i in taken_here:
                heapq.heappush(heap, i)
            chosen.extend(taken_here)
        return chosen

    def find_gang(self, n: int) -> Fit | None:
        """Find where ``n`` slots fit right now, without taking them.

        Args:
            n: Gang size (> 0).

        Returns:
            The placement as (agent position, count) pairs, or ``None`` if it does not fit.
        """
        size = self._size
        top = len(size) - 1
        for c in range(n, top + 1):
            if size[c]:
                return [(self._valid_top(c), n)]
        for p in split_sizes(n):
            if p > top:
                continue
            k = n // p
            if self._at_least(p) >= k:
                return [(i, p) for i in self._select(p, k)]
        return None

    def choose_slots(
        self, i: int, k: int, rank: Mapping[str, int] | None = None
    ) -> tuple[str, ...]:
        """Pick ``k`` free slots of agent ``i``: lowest ``rank`` first (default 1), then slot id."""
        free = self._free[i]
        if rank is None:
            return tuple(sorted(free)[:k])
        return tuple(sorted(free, key=lambda s: (rank.get(s, 1), s))[:k])

    # ---- feasibility and reservations ----------------------------------------------------------

    def feasible(self, n: int) -> bool:
        """Return whether ``n`` slots could ever fit in this pool (with every usable slot free)."""
        cached = self._feasible.get(n)
        if cached is not None:
            return cached
        caps = self._sorted_caps
        ok = bool(caps) and caps[-1] >= n
        if not ok:
            for p in split_sizes(n):
                if len(caps) - bisect_left(caps, p) >= n // p:
                    ok = True
                    break
        self._feasible[n] = ok
        return ok

    def drain_targets(self, n: int) -> list[int]:
        """Choose agents to drain so that a blocked gang of ``n`` slots eventually fits.

        Single-agent shape if any agent is big enough (the one with the most free slots, ties by
        id), else the even split with the fewest agents (those with the most free slots towards
        their share, ties by id). While reserved an agent only gains free slots, so the target
        only ever moves to one at least as close to fitting (a tie moving to a smaller id), and
        the blocked gang's best achievable fit never regresses.

        Args:
            n: Gang size (> 0, feasible).

        Returns:
            Agent positions to reserve (empty if ``n`` is not feasible).
        """
        caps = self._caps
        count = self._count
        single = [i for i, c in enumerate(caps) if c >= n]
        if single:
            return [min(single, key=lambda i: (-count[i], i))]
        for p in split_sizes(n):
            capable = [i for i, c in enumerate(caps) if c >= p]
            if len(capable) >= n // p:
                capable.sort(key=lambda i: (-min(count[i], p), i))
                return capable[: n // p]
        return []

    def reserve_agent(self, i: int) -> None:
        """Take every free slot of agent ``i`` out of the index for the rest of the pass."""
        self.take(i, list(self._free[i]))
