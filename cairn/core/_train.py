"""Metric reporting (mirrors ``det.core.TrainContext``).

Reports are queued and sent by the reporter's background thread, so none of these calls waits on
the network. Only the chief reports; on other ranks they are no-ops.

With ``TensorboardMode.AUTO`` every metrics report is also written as scalars (tag
``<group>/<name>``) to a TensorBoard event file under :meth:`TrainContext.get_tensorboard_path`,
and that directory is uploaded to the trial's storage at most every :data:`TB_SYNC_SECONDS` and
when the context closes.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cairn.core._distributed import DistributedContext
from cairn.core._http import Session
from cairn.core._reporter import Reporter
from cairn.core._tensorboard import EventFileWriter, Mangler, Put, Selector, TensorboardManager
from events.domain.checkpoint_storage import StorageError

log = logging.getLogger("cairn.core")

TRAINING = "training"
VALIDATION = "validation"
BATCH = "batch"
MAX_STATUS = 4096
TB_SYNC_SECONDS = 5.0
"""The least time between two automatic TensorBoard uploads (a final one runs on close)."""


class TensorboardMode(enum.Enum):
    """Who writes and uploads TensorBoard files (``init(tensorboard_mode=...)``).

    Attributes:
        AUTO: metric reports are written as TensorBoard scalars, and the TensorBoard directory is
            uploaded after reports (rate-limited) and on close.
        MANUAL: nothing is written or uploaded unless the training code calls
            :meth:`TrainContext.upload_tensorboard_files`.
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


def default_tensorboard_path(allocation_id: str, rank: int) -> Path:
    """The local TensorBoard directory of this process (under the temp directory; the process id
    keeps a restarted run on the same machine from finding an earlier process's files)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in allocation_id)
    return Path(tempfile.gettempdir()) / "cairn-tensorboard" / f"{safe}-rank{rank}-{os.getpid()}"


class TrainContext:
    """Reports training, validation and other metric groups, progress, status and early exits.

    Args:
        reporter: where report items go.
        distributed: this process's rank (non-chief ranks report nothing).
        run_id: the trial run the reports belong to.
        session: the HTTP session to ask the cluster (``None`` off-cluster).
        experiment_id: the trial's experiment (asked for its best validation).
        tensorboard_mode: whether metric reports are written and uploaded automatically.
        tensorboard_path: the local TensorBoard directory (default: one per process under the
            temp directory).
        tensorboard_storage: where TensorBoard files are uploaded, or ``None`` (off-cluster) to
            upload nothing.
        tensorboard_put: stores a file in the experiment's S3 storage at a path below
            ``tensorboard_storage`` (``None``: storage is a file system).
    """

    def __init__(
        self,
        reporter: Reporter,
        distributed: DistributedContext,
        run_id: int,
        *,
        session: Session | None = None,
        experiment_id: int = 0,
        tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
        tensorboard_path: Path | None = None,
        tensorboard_storage: Path | None = None,
        tensorboard_put: Put | None = None,
    ) -> None:
        self._reporter = reporter
        self._distributed = distributed
        self._run_id = run_id
        self._session = session
        self._experiment_id = experiment_id
        self._tb_mode = TensorboardMode(tensorboard_mode)
        path = tensorboard_path or default_tensorboard_path(
            f"local-{os.getpid()}", distributed.rank
        )
        self._tb = TensorboardManager(
            path, tensorboard_storage, distributed.rank, put=tensorboard_put
        )
        self._tb_writer: EventFileWriter | None = None
        self._tb_lock = threading.Lock()
        self._tb_synced_at = -math.inf
        self._validated: dict[int, set[str]] = {}

    def _submit(self, item: dict[str, Any]) -> None:
        if self._distributed.is_chief:
            self._reporter.submit(item)

    def _write_tensorboard(
        self, group: str, steps_completed: int, metrics: dict[str, float]
    ) -> None:
        if self._tb_mode is not TensorboardMode.AUTO or not metrics:
            return
        with self._tb_lock:
            if self._tb_writer is None:
                self._tb_writer = EventFileWriter(self._tb.base_path)
            writer = self._tb_writer
        writer.add_scalars(steps_completed, {f"{group}/{k}": v for k, v in metrics.items()})
        now = time.monotonic()
        if now - self._tb_synced_at >= TB_SYNC_SECONDS:
            self._tb_synced_at = now
            self._sync_tensorboard()

    def _sync_tensorboard(self) -> bool:
        """Uploads what changed; False (logged) when that failed."""
        try:
            self._tb.sync()
        except (OSError, StorageError) as exc:
            log.warning("cairn: uploading TensorBoard files failed: %s", exc)
            return False
        return True

    def close(self) -> None:
        """Closes the TensorBoard writer and, in AUTO mode, uploads what is left; on a cluster
        the local directory is then removed (everything in it is in storage)."""
        with self._tb_lock:
            if self._tb_writer is not None:
                self._tb_writer.close()
        if self._tb_mode is not TensorboardMode.AUTO:
            return
        if self._sync_tensorboard() and self._tb.storage_path is not None:
            shutil.rmtree(self._tb.base_path, ignore_errors=True)

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
        if self._distributed.is_chief:
            self._write_tensorboard(group, int(steps_completed), cleaned)

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
        self._validated.setdefault(int(steps_completed), set()).update(str(k) for k in metrics)

    def validated(self, steps_completed: int, metric: str) -> bool:
        """Whether this process reported validation ``metric`` at ``steps_completed``."""
        return metric in self._validated.get(int(steps_completed), ())

    def report_progress(self, progress: float) -> None:
        """Reports the trial's progress as a fraction in [0, 1]."""
        value = float(progress)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"progress must be in [0, 1], got {progress}")
        self._submit({"kind": "progress", "progress": value})

    def report_early_exit(self, reason: EarlyExitReason) -> None:
        """Tells the searcher this trial ends early (invalid hyperparameters or a user stop)."""
        self._submit({"kind": "early_exit", "reason": EarlyExitReason(reason).value})

    def set_status(self, status: str) -> None:
        """Shows ``status`` (free text, e.g. ``"evaluating"``) as the trial's current status.

        Raises:
            ValueError: ``status`` is longer than 4096 characters.
        """
        text = str(status)
        if len(text) > MAX_STATUS:
            raise ValueError(f"status must be at most {MAX_STATUS} characters, got {len(text)}")
        log.info("cairn: status: %s", text)
        self._submit({"kind": "status", "status": text})

    def get_experiment_best_validation(self) -> float | None:
        """The best searcher metric any trial of this experiment has reported so far.

        This trial's own queued reports are delivered first, so a validation reported just before
        counts. "Best" follows the searcher's ``smaller_is_better``.

        Returns:
            The value, or ``None`` when no trial has reported the searcher metric yet (always
            ``None`` off-cluster).
        """
        if self._session is None:
            return None
        self._reporter.flush(timeout=30.0)
        answer = self._session.request(
            "GET", f"/experiments/{self._experiment_id}/searcher/best_searcher_validation_metric"
        )
        value = answer.get("metric") if isinstance(answer, dict) else None
        return None if value is None else float(value)

    def get_tensorboard_path(self) -> Path:
        """The local directory whose files are uploaded as this trial's TensorBoard data (created
        if missing); with ``TensorboardMode.AUTO`` metric reports are written there too."""
        self._tb.base_path.mkdir(parents=True, exist_ok=True)
        return self._tb.base_path

    def upload_tensorboard_files(
        self,
        selector: Selector = lambda _: True,
        mangler: Mangler = lambda p, __: p,
    ) -> None:
        """Uploads the files under :meth:`get_tensorboard_path` that are new or changed since
        the last upload to the trial's TensorBoard storage (nothing off-cluster).

        Args:
            selector: given a path relative to the TensorBoard directory, whether to upload it.
            mangler: given that relative path and this process's rank, the relative path to
                store it under (e.g. to keep the files of several ranks apart).
        """
        self._tb.sync(selector, mangler)
