"""``cairn.core.init()`` and the :class:`Context` it returns (mirrors ``det.core.init``)."""

from __future__ import annotations

import itertools
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from cairn.core._checkpoint import CheckpointContext
from cairn.core._distributed import DistributedContext
from cairn.core._http import HTTPStatusError, Session
from cairn.core._info import ClusterInfo, TrialInfo, get_cluster_info
from cairn.core._preempt import PreemptContext, PreemptMode
from cairn.core._profiler import ProfilerContext
from cairn.core._reporter import CLOSE_TIMEOUT, HTTPReporter, LocalReporter, Reporter
from cairn.core._searcher import SearcherContext
from cairn.core._train import (
    EarlyExitReason,
    TensorboardMode,
    TrainContext,
    default_tensorboard_path,
)
from events.domain.checkpoint_storage import CheckpointStorage, S3Storage
from events.domain.storage_paths import tensorboard_dir

log = logging.getLogger("cairn.core")

DEFAULT_LOCAL_STORAGE = "./checkpoints"
ALERT_LEVELS = ("warn", "info", "debug", "error")
MAX_ALERT_TEXT = 10_000
_LOG_LEVELS = {
    "warn": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "error": logging.ERROR,
}


class InvalidHP(Exception):
    """Raise inside ``with cairn.core.init()`` when the hyperparameters cannot work.

    The trial reports an ``invalid_hp`` early exit and the process exits with status 0, so the
    searcher moves on instead of restarting the trial.
    """


class Context:
    """Everything training code uses: ``.train``, ``.checkpoint``, ``.preempt``, ``.searcher``,
    ``.profiler``, ``.distributed`` and ``.info``, plus :meth:`alert`. Build it with
    :func:`init`; use it as a context manager (or call :meth:`close`) so that every queued report
    is delivered before the process exits.

    Attributes:
        info: cluster info; off-cluster a local stand-in with ``on_cluster=False`` (the module
            function ``get_cluster_info()`` still returns ``None`` there).
        train: metric, progress, status and early-exit reporting; TensorBoard files.
        checkpoint: checkpoint storage.
        preempt: the preemption signal.
        searcher: the legacy searcher operations.
        profiler: system-metrics sampling (off until ``profiler.on()``).
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
        searcher: SearcherContext | None = None,
        profiler: ProfilerContext | None = None,
        session: Session | None = None,
    ) -> None:
        self.info = info
        self.train = train
        self.checkpoint = checkpoint
        self.preempt = preempt
        self.distributed = distributed
        self.searcher = searcher or SearcherContext(train, distributed, info.trial.config)
        self.profiler = profiler or ProfilerContext(train, distributed, info.gpu_uuids)
        self._reporter = reporter
        self._session = session
        self._alerts = itertools.count(1)
        self._closed = False
        self._on_close: list[Callable[[bool], None]] = []

    def alert(
        self,
        title: str | None = None,
        description: str | None = None,
        level: str | None = "info",
    ) -> None:
        """Records an alert on the trial: a line in the trial's logs and a ``TrialAlerted``
        event (``GET /api/v1/trials/{id}`` lists them). Off-cluster it is only logged.

        Args:
            title: a short headline.
            description: the details.
            level: ``"warn"``, ``"info"``, ``"debug"`` or ``"error"``.

        Raises:
            ValueError: an unknown ``level`` or a text over 10,000 characters.
        """
        level = level or "info"
        if level not in ALERT_LEVELS:
            raise ValueError(f"level must be one of {list(ALERT_LEVELS)}, got {level!r}")
        title, description = title or "", description or ""
        if len(title) > MAX_ALERT_TEXT or len(description) > MAX_ALERT_TEXT:
            raise ValueError(f"alert title and description are limited to {MAX_ALERT_TEXT} chars")
        log.log(_LOG_LEVELS[level], "cairn alert [%s] %s: %s", level, title, description)
        item = {"kind": "alert", "title": title, "description": description, "level": level}
        if self.distributed.is_chief:
            self._reporter.submit(item)
            return
        if self._session is None:
            return
        # Workers have no reporter: post the one alert now, under a key of this rank's own.
        key = f"{self.info.allocation_id}:rank{self.distributed.rank}:alert:{next(self._alerts)}"
        try:
            self._session.request(
                "POST",
                f"/trials/{self.info.trial.trial_id}/reports",
                {"items": [{**item, "idempotency_key": key}]},
            )
        except (HTTPStatusError, OSError, ValueError) as exc:
            log.warning("cairn: alert could not be recorded: %s", exc)

    @property
    def hparams(self) -> dict[str, Any]:
        """Shortcut for ``info.trial.hparams``."""
        return self.info.trial.hparams

    @property
    def on_cluster(self) -> bool:
        """True when an agent started this process."""
        return self.info.on_cluster

    def start(self) -> None:
        """Determined's explicit start; a cairn context is started by :func:`init` already, so
        this does nothing."""

    def on_close(self, hook: Callable[[bool], None]) -> None:
        """Calls ``hook(failed)`` once this context has closed (``failed``: it was left by an
        exception other than :class:`InvalidHP`, or :meth:`close` was told so). Used by
        ``core_v2`` to end an unmanaged run."""
        self._on_close.append(hook)

    def close(self, timeout: float = CLOSE_TIMEOUT, *, failed: bool = False) -> bool:
        """Stops the preemption watcher and delivers every queued report (bounded).

        Args:
            timeout: the longest to wait for queued reports, in seconds.
            failed: the training code failed (passed on to the hooks of :meth:`on_close`).

        Returns:
            True when nothing was lost.
        """
        if self._closed:
            return True
        self._closed = True
        self.profiler.close()
        self.train.close()
        self.preempt.close()
        delivered = self._reporter.close(timeout)
        for hook in self._on_close:
            hook(failed)
        return delivered

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
        self.close(failed=exc is not None and not _clean_exit(exc))


def _clean_exit(exc: BaseException) -> bool:
    """``sys.exit(0)`` (or ``sys.exit()``) leaves a context cleanly; other exceptions do not."""
    return isinstance(exc, SystemExit) and exc.code in (0, None)


def _local_info(
    hparams: Mapping[str, Any] | None,
    storage: Path,
    latest: str | None,
    *,
    run_id: int = 1,
    config: Mapping[str, Any] | None = None,
) -> ClusterInfo:
    trial = TrialInfo(
        trial_id=0,
        experiment_id=0,
        hparams=dict(hparams or {}),
        run_id=run_id,
        config=dict(config or {}),
    )
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


def local_context(
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
    hparams: Mapping[str, Any] | None = None,
    reporter: Reporter | None = None,
    resume: bool | str | None = True,
    run_id: int = 1,
    config: Mapping[str, Any] | None = None,
) -> Context:
    """The context of training code running off a cluster (what :func:`init` returns there).

    Args:
        distributed: rank/size of this process; read from ``RANK``/``WORLD_SIZE`` if omitted.
        checkpoint_storage: a directory, a shared_fs/directory/s3 config dict (default
            ``./checkpoints``).
        preempt_mode: which ranks call ``should_preempt()``.
        tensorboard_mode: see :class:`TensorboardMode`.
        hparams: the hyperparameters ``info.trial.hparams`` gives.
        reporter: where reports go (default: printed to stderr).
        resume: ``True``: ``info.latest_checkpoint`` is the checkpoint in the storage with the
            most steps; a uuid: that one; ``None`` or ``False``: none.
        run_id: the run number ``info.trial.trial_run_id`` gives.
        config: the experiment config ``info.trial.config`` gives.
    """
    tensorboard_mode = TensorboardMode(tensorboard_mode)
    preempt_mode = PreemptMode(preempt_mode)
    dist = distributed or DistributedContext.from_env()
    remote = _remote_storage(checkpoint_storage)
    root = (
        Path(DEFAULT_LOCAL_STORAGE)
        if remote is not None
        else _storage_path(checkpoint_storage or DEFAULT_LOCAL_STORAGE)
    )
    reports = reporter or LocalReporter()
    checkpoint = CheckpointContext(root, reports, dist, run_id=run_id, storage=remote)
    latest = checkpoint.latest() if resume is True else (resume or None)
    info = _local_info(hparams, checkpoint.root, latest, run_id=run_id, config=config)
    return Context(
        info=info,
        train=TrainContext(reports, dist, run_id=run_id, tensorboard_mode=tensorboard_mode),
        checkpoint=checkpoint,
        preempt=PreemptContext(None, "local", preempt_mode, dist),
        distributed=dist,
        reporter=reports,
    )


CHECKPOINT_ID_ATTEMPTS = 8
"""How many times a new checkpoint's uuid is asked of the API before the save fails."""


def _checkpoint_ids(session: Session, trial_id: int) -> Callable[[], str]:
    """Asks the API for each new checkpoint's uuid (the only uuids it accepts in reports),
    retrying what is worth retrying with backoff."""

    def new_uuid() -> str:
        error: Exception | None = None
        for attempt in range(CHECKPOINT_ID_ATTEMPTS):
            try:
                answer = session.request("POST", f"/trials/{trial_id}/checkpoint-ids", {})
                return str(answer["uuid"])
            except HTTPStatusError as exc:
                if not exc.retryable:
                    raise RuntimeError(f"the API issued no checkpoint uuid: {exc}") from None
                error = exc
            except OSError as exc:
                error = exc
            time.sleep(min(0.2 * 2**attempt, 5.0))
        raise RuntimeError(f"the API issued no checkpoint uuid: {error}")

    return new_uuid


def _bucket_put(remote: CheckpointStorage | None) -> Callable[[Path, Path], None] | None:
    """How a trial's TensorBoard files are stored in its S3 storage (``None``: not S3)."""
    if not isinstance(remote, S3Storage):
        return None
    bucket = remote

    def put(source: Path, target: Path) -> None:
        bucket.put_file(target.as_posix(), source)

    return put


def _remote_storage(checkpoint_storage: Any) -> CheckpointStorage | None:
    """The S3 storage an ``{type: s3, ...}`` config names (``None`` for anything else)."""
    if isinstance(checkpoint_storage, Mapping) and checkpoint_storage.get("type") == "s3":
        return S3Storage.from_config(checkpoint_storage)
    return None


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
        preempt_mode: which ranks call ``should_preempt()`` (see :class:`PreemptMode`).
        tensorboard_mode: whether metric reports are written to TensorBoard files and uploaded
            automatically (see :class:`TensorboardMode`).
        hparams: off-cluster hyperparameters (ignored on a cluster).

    Returns:
        The context.

    Raises:
        ValueError: ``tensorboard_mode`` or ``preempt_mode`` is not one of its enum, or a
            ``CAIRN_*`` variable is malformed.
    """
    tensorboard_mode = TensorboardMode(tensorboard_mode)
    preempt_mode = PreemptMode(preempt_mode)
    cluster = get_cluster_info()
    if cluster is None:
        return local_context(
            distributed=distributed,
            checkpoint_storage=checkpoint_storage,
            preempt_mode=preempt_mode,
            tensorboard_mode=tensorboard_mode,
            hparams=hparams,
        )
    return cluster_context(
        cluster,
        distributed=distributed,
        checkpoint_storage=checkpoint_storage,
        preempt_mode=preempt_mode,
        tensorboard_mode=tensorboard_mode,
    )


def cluster_context(
    cluster: ClusterInfo,
    *,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
    preemptible: bool = True,
) -> Context:
    """The context of a run that reports to the API with ``cluster.token``: a managed trial's
    (from its ``CAIRN_*`` environment) or an unmanaged run's (``core_v2`` off the cluster).

    Only the chief reports; the other ranks' reports go nowhere (as in Determined). An
    unpreemptible run (``preemptible=False``, an unmanaged one) never asks the API whether to
    stop.
    """
    dist = distributed or DistributedContext.from_env()
    session = Session(cluster.master_url, cluster.token)
    run_id = cluster.trial.run_id
    reporter: Reporter = (
        HTTPReporter(session, cluster.trial.trial_id, cluster.allocation_id)
        if dist.is_chief
        else Reporter()
    )
    remote = _remote_storage(
        checkpoint_storage
        if checkpoint_storage is not None
        else cluster.trial.config.get("checkpoint_storage")
    )
    if checkpoint_storage is not None and remote is None:
        root = _storage_path(checkpoint_storage)
    elif cluster.checkpoint_dir:
        root = Path(cluster.checkpoint_dir)
    else:
        root = Path(DEFAULT_LOCAL_STORAGE)
        log.warning("cairn: CAIRN_CHECKPOINT_DIR is not set; checkpoints go to %s", root)
    preempt = PreemptContext(
        session if preemptible else None, cluster.allocation_id, preempt_mode, dist
    )
    preempt.start()
    trial = cluster.trial
    checkpoint = CheckpointContext(
        root,
        reporter,
        dist,
        run_id=run_id,
        storage=remote,
        new_uuid=_checkpoint_ids(session, trial.trial_id),
    )
    train = TrainContext(
        reporter,
        dist,
        run_id=run_id,
        session=session,
        experiment_id=trial.experiment_id,
        tensorboard_mode=tensorboard_mode,
        tensorboard_path=default_tensorboard_path(cluster.allocation_id, dist.rank),
        tensorboard_storage=(
            tensorboard_dir(trial.experiment_id, trial.trial_id)
            if remote is not None
            else checkpoint.root / tensorboard_dir(trial.experiment_id, trial.trial_id)
        ),
        tensorboard_put=_bucket_put(remote),
    )
    return Context(
        info=cluster,
        train=train,
        checkpoint=checkpoint,
        preempt=preempt,
        distributed=dist,
        reporter=reporter,
        searcher=SearcherContext(
            train, dist, trial.config, session=session, trial_id=trial.trial_id
        ),
        session=session,
    )
