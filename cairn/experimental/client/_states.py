"""The SDK's enums: experiment, trial and checkpoint states, sort orders (of checkpoints and
models), download modes."""

from __future__ import annotations

import enum


class OrderBy(enum.Enum):
    """Sort direction (``ASC``/``DESC`` are aliases)."""

    ASCENDING = "asc"
    DESCENDING = "desc"
    ASC = "asc"
    DESC = "desc"


class ExperimentState(enum.Enum):
    """An experiment's state (Determined's names)."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"
    DELETING = "DELETING"
    DELETED = "DELETED"
    DELETE_FAILED = "DELETE_FAILED"


class TrialState(enum.Enum):
    """A trial's state (Determined's names)."""

    ACTIVE = "ACTIVE"
    PAUSED = "PAUSED"
    STOPPING_COMPLETED = "STOPPING_COMPLETED"
    STOPPING_CANCELED = "STOPPING_CANCELED"
    STOPPING_KILLED = "STOPPING_KILLED"
    STOPPING_ERROR = "STOPPING_ERROR"
    COMPLETED = "COMPLETED"
    CANCELED = "CANCELED"
    ERROR = "ERROR"
    DELETING = "DELETING"
    DELETED = "DELETED"
    DELETE_FAILED = "DELETE_FAILED"


TERMINAL_STATES = frozenset(
    {
        ExperimentState.COMPLETED,
        ExperimentState.CANCELED,
        ExperimentState.ERROR,
        ExperimentState.DELETED,
        ExperimentState.DELETE_FAILED,
    }
)
"""The states :meth:`Experiment.wait` returns at."""


class CheckpointState(enum.Enum):
    """A checkpoint's state."""

    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"
    ERROR = "ERROR"
    DELETED = "DELETED"
    PARTIALLY_DELETED = "PARTIALLY_DELETED"


class CheckpointSortBy(enum.Enum):
    """Fields checkpoints can be sorted by (besides a validation metric's name)."""

    UUID = "uuid"
    TRIAL_ID = "trial_id"
    BATCH_NUMBER = "steps_completed"
    END_TIME = "reported_at"
    STATE = "state"
    SEARCHER_METRIC = "searcher_metric"


class DownloadMode(enum.Enum):
    """How :meth:`Checkpoint.download` fetches files; cairn always goes through the master, so
    every mode behaves as ``MASTER``."""

    DIRECT = "direct"
    MASTER = "master"
    AUTO = "auto"


class ModelSortBy(enum.Enum):
    """Fields models can be sorted by."""

    NAME = "name"
    DESCRIPTION = "description"
    CREATION_TIME = "creation_time"
    LAST_UPDATED_TIME = "last_updated_time"
