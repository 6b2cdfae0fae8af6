"""The singleton-style Core API, Determined's ``determined.experimental.core_v2``.

``determined.experimental.core_v2`` (in a trial, or after :func:`cairn.compat.enable`) is this
very module, so a Determined script runs unchanged::

    from determined.experimental import core_v2

    core_v2.init(config=core_v2.Config(name="my-run", external_experiment_id="exp-1",
                                       external_trial_id="trial-1", hparams={"lr": 0.1}))
    start = 0
    if core_v2.info.latest_checkpoint:
        with core_v2.checkpoint.restore_path(core_v2.info.latest_checkpoint) as path:
            start = int((path / "step").read_text())
    for step in range(start, 10):
        core_v2.train.report_training_metrics(steps_completed=step + 1, metrics={"loss": 1.0})
    with core_v2.checkpoint.store_path({"steps_completed": 10}) as (path, uuid):
        (path / "step").write_text("10")
    core_v2.close()

**Managed**: inside a cairn trial (``get_cluster_info()`` says TRIAL) the config is ignored and
the module's context is the trial's, as ``cairn.core.init()`` builds it.

**Unmanaged**: anywhere else the run is described by :class:`Config`. With no master configured
it runs locally (:mod:`cairn.experimental._unmanaged`): reports are printed, checkpoints go to
``checkpoint_storage`` (default ``~/.local/share/cairn/checkpoints``), and a run naming the same
``external_experiment_id`` and ``external_trial_id`` as an earlier one finds that one's latest
checkpoint in ``core_v2.info.latest_checkpoint``. With a master configured (``CAIRN_MASTER``,
``DET_MASTER`` or a ``client``) the run reports to it as the logged-in user: the cluster keeps an
unmanaged experiment and trial per ``external_experiment_id`` and ``external_trial_id``, shows
their metrics and checkpoints as a managed trial's, resumes the trial on the next run with the
same ids, and marks it ERROR when the script fails or dies (``docs/unmanaged.md``).

After :func:`init`, the module's ``train``, ``checkpoint``, ``distributed``, ``preempt``,
``searcher``, ``profiler`` and ``info`` are the context's (``None`` before); :func:`close` (also
run at exit) delivers what is queued and ends the run. ``init()`` again closes the previous run
first. Preemption never comes to an unmanaged run (``should_preempt()`` is False).
"""

from __future__ import annotations

import atexit
import dataclasses
import sys
import uuid
import warnings
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from cairn.core import (
    CheckpointContext,
    ClusterInfo,
    Context,
    DistributedContext,
    PreemptContext,
    PreemptMode,
    ProfilerContext,
    SearcherContext,
    TensorboardMode,
    TrainContext,
    get_cluster_info,
)
from cairn.core import init as core_init
from cairn.experimental._unmanaged import (
    UnmanagedBackend,
    UnmanagedNotSupportedError,
    backend_for,
    default_storage,
)

if TYPE_CHECKING:
    from cairn.experimental.client import Determined

__all__ = [
    "Config",
    "DefaultConfig",
    "DistributedContext",
    "PreemptMode",
    "TensorboardMode",
    "UnmanagedConfig",
    "UnmanagedNotSupportedError",
    "checkpoint",
    "close",
    "distributed",
    "info",
    "init",
    "init_context",
    "preempt",
    "profiler",
    "searcher",
    "train",
    "url_reverse_webui_exp_view",
]

train: TrainContext | None = None
checkpoint: CheckpointContext | None = None
distributed: DistributedContext | None = None
preempt: PreemptContext | None = None
searcher: SearcherContext | None = None
profiler: ProfilerContext | None = None
info: ClusterInfo | None = None

DEFAULT_METRIC = "unmanaged"
"""The searcher metric an unmanaged run's config names when it names none."""


@dataclasses.dataclass
class Config:
    """An unmanaged run's description (ignored inside a trial, whose config rules).

    Attributes:
        name: the experiment's name (default ``unmanaged-<8 hex digits>``).
        hparams: the trial's hyperparameters (``core_v2.info.trial.hparams``).
        data: free-form data (``core_v2.info.user_data``).
        description: the experiment's description.
        labels: the experiment's labels.
        workspace: the workspace of the experiment's project (with ``project``; neither: the
            default one).
        project: the project the experiment is created in.
        checkpoint_storage: a directory, ``file://`` or ``s3://bucket/prefix`` URL, or a
            checkpoint storage config mapping.
        searcher: the searcher section (default ``{name: single, metric: unmanaged}``).
        external_experiment_id: names the experiment across runs.
        external_trial_id: names the trial within it across runs (needs
            ``external_experiment_id``); a run naming both resumes the trial.
    """

    name: str | None = None
    hparams: dict[str, Any] | None = None
    data: dict[str, Any] | None = None
    description: str | None = None
    labels: list[str] | None = None
    workspace: str | None = None
    project: str | None = None
    checkpoint_storage: str | dict[str, Any] | None = None
    searcher: dict[str, Any] | None = None
    external_experiment_id: str | None = None
    external_trial_id: str | None = None

    def experiment_config(self, storage: Mapping[str, Any]) -> dict[str, Any]:
        """The experiment config this run stands for (``core_v2.info.trial.config``)."""
        config: dict[str, Any] = {
            "name": self.name or f"unmanaged-{uuid.uuid4().hex[:8]}",
            "searcher": dict(self.searcher or {"name": "single", "metric": DEFAULT_METRIC}),
            "checkpoint_storage": dict(storage),
        }
        if self.hparams:
            config["hyperparameters"] = dict(self.hparams)
        for key in ("data", "description", "labels", "workspace", "project"):
            value = getattr(self, key)
            if value is not None:
                config[key] = value
        return config


class DefaultConfig(Config):
    """Deprecated by Determined: use :class:`Config`."""

    def __init__(self, **kwargs: Any) -> None:
        warnings.warn(
            "DefaultConfig is deprecated: use core_v2.Config", FutureWarning, stacklevel=2
        )
        super().__init__(**kwargs)


class UnmanagedConfig(Config):
    """Deprecated by Determined: use :class:`Config`."""

    def __init__(self, **kwargs: Any) -> None:
        warnings.warn(
            "UnmanagedConfig is deprecated: use core_v2.Config", FutureWarning, stacklevel=2
        )
        super().__init__(**kwargs)


class _State:
    """The singleton's context and backend, and the exit hooks installed once."""

    context: Context | None = None
    backend: UnmanagedBackend | None = None
    hooks_installed: bool = False
    failed: bool = False


def _merge(
    config: Config | None, defaults: Config | None, unmanaged: Config | None
) -> Config | None:
    if defaults is not None or unmanaged is not None:
        warnings.warn(
            "init(defaults=..., unmanaged=...) is deprecated: pass config=core_v2.Config(...)",
            FutureWarning,
            stacklevel=3,
        )
    if config is not None:
        return config
    if defaults is None:
        return unmanaged
    merged = dataclasses.replace(defaults)
    if unmanaged is not None:
        for key in ("workspace", "project", "external_experiment_id", "external_trial_id"):
            if getattr(merged, key) is None:
                setattr(merged, key, getattr(unmanaged, key))
    return merged


def _managed() -> bool:
    cluster = get_cluster_info()
    return cluster is not None and cluster.task_type == "TRIAL"


def init_context(
    *,
    config: Config | None = None,
    defaults: Config | None = None,
    unmanaged: Config | None = None,
    client: Determined | None = None,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> Context:
    """The context of this run, for ``with core_v2.init_context(config=...) as ctx:``.

    Args:
        config: the unmanaged run's description (ignored inside a trial).
        defaults: deprecated; merged into ``config``'s place.
        unmanaged: deprecated; merged into ``config``'s place.
        client: an SDK connection to report to (default: the configured master, if any).
        distributed: rank/size of this process (default: from ``RANK``/``WORLD_SIZE``).
        checkpoint_storage: overrides the config's (and a trial's) checkpoint storage.
        preempt_mode: see :class:`cairn.core.PreemptMode`.
        tensorboard_mode: see :class:`cairn.core.TensorboardMode`.

    Raises:
        ValueError: off a cluster with no config, or a config that cannot run.
        cairn.client.ApiError: the master refused the run.
    """
    run_config = _merge(config, defaults, unmanaged)
    if _managed():
        return core_init(
            distributed=distributed,
            checkpoint_storage=checkpoint_storage,
            preempt_mode=preempt_mode,
            tensorboard_mode=tensorboard_mode,
        )
    if run_config is None:
        raise ValueError("outside a trial, core_v2 needs config=core_v2.Config(...)")
    backend = backend_for(client)
    storage = checkpoint_storage or run_config.checkpoint_storage or str(default_storage())
    context = backend.start(
        run_config,
        checkpoint_storage=storage,
        distributed=distributed,
        preempt_mode=PreemptMode(preempt_mode),
        tensorboard_mode=TensorboardMode(tensorboard_mode),
    )
    _State.backend = backend
    return context


def _set_globals(context: Context | None) -> None:
    module = sys.modules[__name__]
    for name in ("train", "checkpoint", "distributed", "preempt", "searcher", "profiler", "info"):
        setattr(module, name, getattr(context, name) if context is not None else None)


def _install_hooks() -> None:
    """Once per process: close at exit, and remember an uncaught exception or a non-zero
    ``sys.exit`` so the run ends failed."""
    if _State.hooks_installed:
        return
    _State.hooks_installed = True
    atexit.register(close)
    previous = sys.excepthook

    def excepthook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        _State.failed = True
        previous(kind, value, tb)

    sys.excepthook = excepthook


def init(
    *,
    config: Config | None = None,
    defaults: Config | None = None,
    unmanaged: Config | None = None,
    client: Determined | None = None,
    distributed: DistributedContext | None = None,
    checkpoint_storage: str | dict[str, Any] | None = None,
    preempt_mode: PreemptMode = PreemptMode.WorkersAskChief,
    tensorboard_mode: TensorboardMode = TensorboardMode.AUTO,
) -> None:
    """Starts this process's run and sets the module's ``train``, ``checkpoint``, ``info``, ...
    (the arguments are :func:`init_context`'s). A run already started is closed first.

    Raises:
        ValueError: off a cluster with no config, or a config that cannot run.
        cairn.client.ApiError: the master refused the run.
    """
    close()
    context = init_context(
        config=config,
        defaults=defaults,
        unmanaged=unmanaged,
        client=client,
        distributed=distributed,
        checkpoint_storage=checkpoint_storage,
        preempt_mode=preempt_mode,
        tensorboard_mode=tensorboard_mode,
    )
    _State.context, _State.failed = context, False
    _set_globals(context)
    _install_hooks()


def close() -> None:
    """Delivers what the run has queued and ends it (failed if an exception went uncaught);
    the module's ``train`` is ``None`` afterwards. Safe to call again."""
    context, _State.context = _State.context, None
    if context is not None:
        context.close(failed=_State.failed)
    # As in Determined, only ``train`` is reset; the other globals keep their last values.
    setattr(sys.modules[__name__], "train", None)  # noqa: B010


def url_reverse_webui_exp_view() -> str:
    """Where the run's experiment is shown (a local run: its checkpoint directory's URL).

    Raises:
        RuntimeError: :func:`init` has not run.
    """
    if info is None:
        raise RuntimeError("core_v2.init() has not run")
    if info.on_cluster:
        return f"{info.master_url}/#/experiments/{info.trial.experiment_id}"
    if _State.backend is not None:
        return _State.backend.webui_url()
    return default_storage().as_uri()
