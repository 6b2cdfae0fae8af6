"""Event payload models, one module per stream category. Importing this package registers them."""

from events.types.agent import AgentLost, AgentRegistered, SlotsDisabled, SlotsEnabled
from events.types.audit import RequestAccepted, RequestRejected
from events.types.experiment import (
    CheckpointsDeleted,
    ExperimentArchived,
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialRequested,
    TrialStopRequested,
)
from events.types.experiment_changes import (
    CheckpointsDeleteRequested,
    ExperimentContinued,
    ExperimentDescribed,
    ExperimentLabelsChanged,
    ExperimentRenamed,
    ExperimentResourcesChanged,
)
from events.types.system import LeaderElected
from events.types.template import TemplateRemoved, TemplateSet
from events.types.trial import (
    CheckpointSaved,
    KillRequested,
    MetricsReported,
    PreemptionRequested,
    SlotsAllocated,
    SlotsReleased,
    TrialAlerted,
    TrialEarlyExited,
    TrialExited,
    TrialKillRequested,
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
    "CheckpointsDeleteRequested",
    "CheckpointsDeleted",
    "ExperimentArchived",
    "ExperimentContinued",
    "ExperimentDescribed",
    "ExperimentLabelsChanged",
    "ExperimentRenamed",
    "ExperimentResourcesChanged",
    "ExperimentStateChanged",
    "ExperimentSubmitted",
    "KillRequested",
    "LeaderElected",
    "MetricsReported",
    "PreemptionRequested",
    "RequestAccepted",
    "RequestRejected",
    "SlotsAllocated",
    "SlotsDisabled",
    "SlotsEnabled",
    "SlotsReleased",
    "TemplateRemoved",
    "TemplateSet",
    "TrialAlerted",
    "TrialEarlyExited",
    "TrialExited",
    "TrialKillRequested",
    "TrialRequested",
    "TrialRestarted",
    "TrialStarted",
    "TrialStateChanged",
    "TrialStopRequested",
    "ValidationReported",
    "WorkloadCompleted",
]
