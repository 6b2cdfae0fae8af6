"""Plain-data input and output of the scheduling policy.

A scheduler service folds the log into a :class:`ClusterView` (agents and their slots, pending
allocation requests, current allocations, pool settings), calls
:func:`services.scheduler.policy.decide`, and turns each returned :class:`Allocate` /
:class:`Preempt` into an event. Everything here is frozen and hashable; collections are tuples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from events.domain.config.experiment_settings import DEFAULT_PRIORITY as DEFAULT_PRIORITY

MIN_PRIORITY = 1
"""Most important priority."""

MAX_PRIORITY = 99
"""Least important priority."""

DeviceType = Literal["cpu", "cuda"]
SchedulerType = Literal["priority", "fair_share"]


@dataclass(frozen=True, slots=True)
class Slot:
    """One schedulable device of an agent.

    Attributes:
        id: Slot id, unique within its agent.
        enabled: Disabled slots are never allocated.
        device_type: ``"cpu"`` or ``"cuda"``; informational (pools are expected to be homogeneous).
    """

    id: str
    enabled: bool = True
    device_type: DeviceType = "cuda"


@dataclass(frozen=True, slots=True)
class Agent:
    """A machine offering slots to one resource pool.

    Attributes:
        id: Agent id, unique in the cluster.
        resource_pool: Pool the agent belongs to (``""`` means the view's default pool).
        slots: The agent's slots.
        enabled: A disabled agent receives no new allocation (its running ones are untouched).
    """

    id: str
    resource_pool: str = ""
    slots: tuple[Slot, ...] = ()
    enabled: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "slots", tuple(self.slots))


@dataclass(frozen=True, slots=True)
class PendingRequest:
    """A request for slots that has not been allocated yet (typically one trial run).

    Attributes:
        request_id: Allocation request id; becomes the allocation's id.
        experiment_id: Owning experiment (the fair-share group and the ``max_slots`` scope).
        slots_needed: Gang size; all or nothing. ``0`` is a zero-slot task, admitted apart.
        order: Monotonic submit sequence; smaller is older (FIFO within a priority).
        trial_id: Owning trial, if any (informational).
        priority: 1..99, lower is more important.
        weight: The experiment's fair-share weight (> 0).
        resource_pool: Pool to run in (``""`` means the default pool, or the aux pool for
            zero-slot tasks).
        max_slots: The experiment's cap on slots held at once (``None``: unlimited).
        preemptible: Whether the resulting allocation may be preempted.
    """

    request_id: str
    experiment_id: str
    slots_needed: int
    order: int
    trial_id: int | None = None
    priority: int = DEFAULT_PRIORITY
    weight: float = 1.0
    resource_pool: str = ""
    max_slots: int | None = None
    preemptible: bool = True

    def __post_init__(self) -> None:
        if self.slots_needed < 0:
            raise ValueError(f"{self.request_id}: slots_needed must be >= 0")
        if not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise ValueError(f"{self.request_id}: priority must be in 1..99")
        if not self.weight > 0:
            raise ValueError(f"{self.request_id}: weight must be > 0")
        if self.max_slots is not None and self.max_slots < 0:
            raise ValueError(f"{self.request_id}: max_slots must be >= 0")


class Placement(NamedTuple):
    """The slots one allocation holds on one agent (empty for a zero-slot task)."""

    agent_id: str
    slot_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Allocation:
    """A current allocation: slots held by a request that is running (or starting).

    Attributes:
        request_id: The allocation request id.
        experiment_id: Owning experiment.
        placements: Slots held, per agent.
        resource_pool: Pool it runs in (``""``: default pool).
        priority: Priority it was scheduled with.
        order: Recency sequence (allocation or submit order); larger is newer.
        preemptible: Whether it may be preempted.
        preemption_requested: A preemption was already requested; its slots are about to be
            freed and it is never preempted again.
        weight: The experiment's fair-share weight, for experiments with nothing pending.
    """

    request_id: str
    experiment_id: str
    placements: tuple[Placement, ...]
    resource_pool: str = ""
    priority: int = DEFAULT_PRIORITY
    order: int = 0
    preemptible: bool = True
    preemption_requested: bool = False
    weight: float = 1.0
    _slots: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        placements = tuple(Placement(p[0], tuple(p[1])) for p in self.placements)
        object.__setattr__(self, "placements", placements)
        object.__setattr__(self, "_slots", sum(len(p.slot_ids) for p in placements))

    @property
    def slots(self) -> int:
        """Number of slots held."""
        return self._slots


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Scheduler settings of one resource pool.

    Attributes:
        name: Pool name.
        scheduler: ``"priority"`` or ``"fair_share"``.
        preemption: Whether the pool may preempt running allocations.
        max_zero_slot_tasks_per_agent: Cap on zero-slot tasks per agent (``None``: unlimited).
    """

    name: str
    scheduler: SchedulerType = "priority"
    preemption: bool = False
    max_zero_slot_tasks_per_agent: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """Everything the policy needs to decide one scheduling pass.

    Attributes:
        agents: All known agents (unique ids).
        pending: Requests waiting for slots (unique request ids).
        allocations: Current allocations (unique request ids).
        pools: Pool settings; a pool without an entry uses ``PoolConfig(name)``.
        default_pool: Pool of requests and agents whose ``resource_pool`` is ``""``.
        default_aux_pool: Pool of zero-slot requests with ``resource_pool == ""``
            (``None``: the default pool).
    """

    agents: tuple[Agent, ...] = ()
    pending: tuple[PendingRequest, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    pools: tuple[PoolConfig, ...] = ()
    default_pool: str = "default"
    default_aux_pool: str | None = None

    def __post_init__(self) -> None:
        for name in ("agents", "pending", "allocations", "pools"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    def pool_config(self, name: str) -> PoolConfig:
        """Return the settings of pool ``name`` (defaults when it has no entry)."""
        for cfg in self.pools:
            if cfg.name == name:
                return cfg
        return PoolConfig(name)


@dataclass(frozen=True, slots=True)
class Allocate:
    """Decision: give ``request_id`` these slots (a whole gang) now."""

    request_id: str
    placements: tuple[Placement, ...]

    @property
    def slots(self) -> int:
        """Number of slots allocated."""
        return sum(len(p.slot_ids) for p in self.placements)


@dataclass(frozen=True, slots=True)
class Preempt:
    """Decision: ask the allocation ``request_id`` to checkpoint and release its slots."""

    request_id: str
    reason: str


Decision = Allocate | Preempt
"""One scheduling decision."""
