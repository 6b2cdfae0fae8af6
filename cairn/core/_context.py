"""``cairn.core.init()`` and the :class:`Context` it returns (mirrors ``det.core.init``)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from cairn.core._checkpoint import CheckpointContext
from cairn.core._distributed import DistributedContext
from cairn.core._http import Session
from cairn.core._info import ClusterInfo, TrialInfo, get_cluster_info
from cairn.core._preempt import PreemptContext, PreemptMode
from cairn.core._reporter import CLOSE_TIMEOUT, HTTPReporter, LocalReporter, Reporter
from cairn.core._train import EarlyExitReason, TensorboardMode, TrainContext

log = logging.getLogger("cairn.core")

DEFAULT_LOCAL_STORAGE = "./checkpoints"


class InvalidHP(Exception):
    """Raise inside ``with cairn.core.init()`` when the hyperparameters cannot work.

    The trial reports an ``invalid_hp`` early exit and the process exits with status 0, so the
    searcher moves on instead of restarting the trial.
    """


class Context:
    """Everything training code uses: ``.train``, ``.checkpoint``, ``.preempt``, ``.distributed``
    and ``.info``. Build it with :func:`init`; use it as a context manager (or call
    :meth:`close`) so that every queued report is delivered before the process exits.

    Attributes:
        info: cluster info; off-cluster a local stand-in with ``on_cluster=False`` (the module
            function ``get_cluster_info()`` still returns ``None`` there).
        train: metric, progress and early-exit reporting.
        checkpoint: checkpoint storage.
        preempt: the preemption signal.
        distributed: rank and size of this process.
    """

    def __init__(
        self,
        *,
        info: ClusterInfo,
        train: TrainContext,
        checkpoint: CheckpointContext,
        preempt: PreemptContext,
        distributed: DistributedContext,
        reporter: Reporter,
    ) -> None:
        self.info = info
        self.train = train
        self.checkpoint = checkpoint
        self.preempt = preempt
        self.distributed = distributed
        self._reporter = reporter
        self._closed = False

    @property
    def hparams(self) -> dict[str, Any]:
        """Shortcut for ``info.trial.hparams``."""
        return self.info.trial.hparams

    @property
    def on_cluster(self) -> bool:
        """True when an agent started this process."""
        return self.info.on_cluster

    def close(self, timeout: float = CLOSE_TIMEOUT) -> bool:
        """Stops the preemption watcher and delivers every queued report (bounded).

        Returns:
            True when nothing was lost.
        """
        if self._closed:
            return True
        self._closed = True
        self.preempt.close()
        return self._reporter.close(timeout)

    def __enter__(self) -> Context:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, InvalidHP):
            log.info("cairn: invalid hyperparameters: %s", exc)
            self.train.report_early_exit(EarlyExitReason.INVALID_HP)
            self.close()
            sys.exit(0)
        self.close()


def _local_info(
    hparams: Mapping[str, Any] | None, storage: Path, latest: str | None
) -> ClusterInfo:
    trial = TrialInfo(trial_id=0, experiment_id=0, hparams=dict(hparams or {}))
    return ClusterInfo(
        master_url="",
        token="",
        agent_id="local",
        allocation_id="local",
        slot_ids=[],
        latest_checkpoint=latest,
        checkpoint_dir=str(storage),
        trial=trial,
        on_cluster=False,
        task_id="local",
        container_slot_counts=[1],
    )


def _storage_path(checkpoint_storage: str | os.PathLike[str] | Mapping[str, Any]) -> Path:
    if isinstance(checkpoint_storage, Mapping):
        kind = checkpoint_storage.get("type")
        if kind == "shared_fs":
            host = Path(str(checkpoint_storage["host_path"]))
            sub = checkpoint_storage.get("storage_path")
            return host / str(sub) if sub else host
        if kind == "directory":
            return Path(str(checkpoint_storage["container_path"]))
        raise ValueError(f"unsupported checkpoint_storage type {kind!r}")
    return Path(checkpoint_storage)


def init(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
    hparams: Mapping[str, Any] | None = None,
) -> Context:
    """Creates the Core API context: ``with cairn.core.init() as ctx: ...``.

    On a cluster everything comes from the ``CAIRN_*`` environment. Off-cluster
    (``python train.py``) the hyperparameters are ``hparams`` (or empty), checkpoints go to
    ``checkpoint_storage`` (default ``./checkpoints``) and ``info.latest_checkpoint`` is the
    checkpoint there with the most steps, so a second run resumes; reports are printed; the
    trial is never preempted.

    Args:
        distributed: rank/size of this process; read from ``RANK``/``WORLD_SIZE`` if omitted.
        checkpoint_storage: a directory (or a shared_fs/directory config dict); on a cluster it
            overrides ``CAIRN_CHECKPOINT_DIR``.
        preempt_mode: accepted for compatibility with Determined.
        tensorboard_mode: accepted for compatibility with Determined (see
            :class:`TensorboardMode`).
        hparams: off-cluster hyperparameters (ignored on a cluster).

    Returns:
        The context.

    Raises:
        ValueError: ``tensorboard_mode`` is not a :class:`TensorboardMode`, or a ``CAIRN_*``
            variable is malformed.
    """
    TensorboardMode(tensorboard_mode)
    dist = distributed or DistributedContext.from_env()
    cluster = get_cluster_info()
    if cluster is None:
        root = _storage_path(checkpoint_storage or DEFAULT_LOCAL_STORAGE)
        reporter: Reporter = LocalReporter()
        checkpoint = CheckpointContext(root, reporter, dist, run_id=1)
        info = _local_info(hparams, checkpoint.root, checkpoint.latest())
        return Context(
            info=info,
            train=TrainContext(reporter, dist, run_id=1),
            checkpoint=checkpoint,
            preempt=PreemptContext(None, "local", preempt_mode),
            distributed=dist,
            reporter=reporter,
        )
    session = Session(cluster.master_url, cluster.token)
    run_id = cluster.trial.run_id
    reporter = (
        HTTPReporter(session, cluster.trial.trial_id, cluster.allocation_id)
        if dist.is_chief
        else Reporter()
    )
    if checkpoint_storage is not None:
        root = _storage_path(checkpoint_storage)
    elif cluster.checkpoint_dir:
        root = Path(cluster.checkpoint_dir)
    else:
        root = Path(DEFAULT_LOCAL_STORAGE)
        log.warning("cairn: CAIRN_CHECKPOINT_DIR is not set; checkpoints go to %s", root)
    preempt = PreemptContext(session, cluster.allocation_id, preempt_mode)
    preempt.start()
    return Context(
        info=cluster,
        train=TrainContext(reporter, dist, run_id=run_id),
        checkpoint=CheckpointContext(root, reporter, dist, run_id=run_id),
        preempt=preempt,
        distributed=dist,
        reporter=reporter,
    )
