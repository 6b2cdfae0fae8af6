"""The scheduling policy: a pure function from a cluster snapshot to allocation decisions.

No database, network, clock or RNG: the scheduler service folds the log into a
:class:`ClusterView`, calls :func:`decide`, and records each :class:`Allocate` / :class:`Preempt`
as an event. Replaying the log never calls it again.
"""

from __future__ import annotations

from services.scheduler.policy.decide import decide
from services.scheduler.policy.fair_share import water_fill
from services.scheduler.policy.state import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    Agent,
    Allocate,
    Allocation,
    ClusterView,
    Decision,
    DeviceType,
    PendingRequest,
    Placement,
    PoolConfig,
    Preempt,
    SchedulerType,
    Slot,
)

__all__ = [
    "DEFAULT_PRIORITY",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "Agent",
    "Allocate",
    "Allocation",
    "ClusterView",
    "Decision",
    "DeviceType",
    "PendingRequest",
    "Placement",
    "PoolConfig",
    "Preempt",
    "SchedulerType",
    "Slot",
    "decide",
    "water_fill",
]
