"""Metric reporting (mirrors ``det.core.TrainContext``).

Reports are queued and sent by the reporter's background thread, so none of these calls waits on
the network. Only the chief reports; on other ranks they are no-ops.
"""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Mapping
from typing import Any

from cairn.core._distributed import DistributedContext
from cairn.core._reporter import Reporter

log = logging.getLogger("cairn.core")

TRAINING = "training"
VALIDATION = "validation"
BATCH = "batch"


class TensorboardMode(enum.Enum):
    """Who uploads TensorBoard files (``init(tensorboard_mode=...)``).

    cairn does not sync TensorBoard files yet, so both modes do the same (nothing); the names
    exist so Determined code ports unchanged.

    Attributes:
        AUTO: the Core API uploads them after each metrics report.
        MANUAL: the training code uploads them itself.
    """

    AUTO = "AUTO"
    MANUAL = "MANUAL"


class EarlyExitReason(enum.Enum):
    """Why the training code ended its trial early."""

    INVALID_HP = "invalid_hp"
    USER_REQUESTED_STOP = "user_requested_stop"


def _clean(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Metric values as finite floats (tensors and numpy scalars included).

    Non-finite values (NaN, inf) cannot be stored as JSON numbers and are left out, with a warning.

    Raises:
        TypeError: for a value that is not a number.
    """
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise TypeError(
                    f"metric {name!r} must be a number, got {type(value).__name__}"
                ) from None
        if not math.isfinite(number):
            log.warning("cairn: metric %r is %s; not reported", name, number)
            continue
        out[str(name)] = number
    return out


class TrainContext:
    """Reports training, validation and other metric groups, progress and early exits.

    Args:
        reporter: where report items go.
        distributed: this process's rank (non-chief ranks report nothing).
        run_id: the trial run the reports belong to.
    """

    def __init__(self, reporter: Reporter, distributed: DistributedContext, run_id: int) -> None:
        self._reporter = reporter
        self._distributed = distributed
        self._run_id = run_id

    def _submit(self, item: dict[str, Any]) -> None:
        if self._distributed.is_chief:
            self._reporter.submit(item)

    def report_metrics(self, group: str, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Reports one group of metrics at ``steps_completed``.

        Args:
            group: ``"training"``, ``"validation"`` or any other group name.
            steps_completed: the step count these metrics describe (not a delta).
            metrics: name -> number.
        """
        if not group:
            raise ValueError("group must not be empty")
        if int(steps_completed) < 0:
            raise ValueError(f"steps_completed must be >= 0, got {steps_completed}")
        cleaned = _clean(metrics)
        self._submit(
            {
                "kind": "metrics",
                "group": group,
                "steps_completed": int(steps_completed),
                "metrics": cleaned,
                "run_id": self._run_id,
            }
        )

    def report_training_metrics(
        self,
        steps_completed: int,
        metrics: Mapping[str, Any],
        batch_metrics: list[Mapping[str, Any]] | None = None,
    ) -> None:
        """Reports the training metrics of the workload that ended at ``steps_completed``.

        Args:
            steps_completed: the step count reached.
            metrics: averaged training metrics.
            batch_metrics: optional per-batch metrics of the last ``len(batch_metrics)`` steps;
                each is reported in the ``"batch"`` group at its own step.
        """
        self.report_metrics(TRAINING, steps_completed, metrics)
        if batch_metrics:
            first = int(steps_completed) - len(batch_metrics) + 1
            for offset, one in enumerate(batch_metrics):
                self.report_metrics(BATCH, max(first + offset, 0), one)

    def report_validation_metrics(self, steps_completed: int, metrics: Mapping[str, Any]) -> None:
        """Reports validation metrics at ``steps_completed`` (the searcher reads these)."""
        self.report_metrics(VALIDATION, steps_completed, metrics)

    def report_progress(self, progress: float) -> None:
        """Reports the trial's progress as a fraction in [0, 1]."""
        value = float(progress)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"progress must be in [0, 1], got {progress}")
        self._submit({"kind": "progress", "progress": value})

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """Tells the searcher this trial ends early (invalid hyperparameters or a user stop)."""
        self._submit({"kind": "early_exit", "reason": EarlyExitReason(reason).value})

    def get_experiment_best_validation(self) -> float | None:
        """The experiment's best searcher metric so far.

        Returns:
            ``None``: the agent/trial protocol has no endpoint for it yet (nor off-cluster).
        """
        return None
