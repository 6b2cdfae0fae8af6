"""Event payload models, one module per stream category. Importing this package registers them."""

from events.types.agent import AgentLost, AgentRegistered
from events.types.experiment import ExperimentSubmitted, TrialRequested, TrialStopRequested
from events.types.system import LeaderElected
from events.types.trial import (
    CheckpointSaved,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialStarted,
    ValidationReported,
    WorkloadCompleted,
)

__all__ = [
    "AgentLost",
    "AgentRegistered",
    "CheckpointSaved",
    "ExperimentSubmitted",
    "LeaderElected",
    "SlotsAllocated",
    "SlotsReleased",
    "TrialExited",
    "TrialRequested",
    "TrialStarted",
    "TrialStopRequested",
    "ValidationReported",
    "WorkloadCompleted",
]
