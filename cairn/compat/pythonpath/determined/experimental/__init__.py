"""``determined.experimental``: the Python SDK (``client``: ``Determined``, ``Experiment``,
``Trial``, ``Checkpoint``, ...) and ``core_v2``, both cairn's (``cairn.experimental``)."""

from cairn.experimental import client
from cairn.experimental.client import (
    Checkpoint,
    CheckpointState,
    Determined,
    DownloadMode,
    Experiment,
    ExperimentState,
    OrderBy,
    Trial,
    TrialState,
)

__all__ = [
    "Checkpoint",
    "CheckpointState",
    "Determined",
    "DownloadMode",
    "Experiment",
    "ExperimentState",
    "OrderBy",
    "Trial",
    "TrialState",
    "client",
]
