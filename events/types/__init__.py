"""Event payload models, one module per stream category. Importing this package registers them."""

from events.types.agent import AgentLost, AgentRegistered
from events.types.experiment import (
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialRequested,
    TrialStopRequested,
)
from events.types.system import LeaderElected
from events.types.trial import (
    CheckpointSaved,
    KillRequested,
    PreemptionRequested,
    SlotsAllocated,
    SlotsReleased,
    TrialEarlyExited,
    TrialExited,
    TrialRestarted,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
    WorkloadCompleted,
)

__all__ = [
    "AgentLost",
    "AgentRegistered",
    "CheckpointSaved",
    "ExperimentStateChanged",
    "ExperimentSubmitted",
    "KillRequested",
    "LeaderElected",
    "PreemptionRequested",
    "SlotsAllocated",
    "SlotsReleased",
    "TrialEarlyExited",
    "TrialExited",
    "TrialRequested",
    "TrialRestarted",
    "TrialStarted",
    "TrialStateChanged",
    "TrialStopRequested",
    "ValidationReported",
    "WorkloadCompleted",
]
