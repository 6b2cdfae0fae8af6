"""The Core API: what training code imports to run on cairn (modelled on ``det.core``).

A Determined Core API script ports by changing its import line to ``import cairn as det``
(``det.core`` is this package)::

    import cairn as det

    with det.core.init() as ctx:
        hparams = ctx.info.trial.hparams
        for step in range(start, total):
            ...
            ctx.train.report_training_metrics(steps_completed=step + 1, metrics={"loss": loss})
            if ctx.preempt.should_preempt():
                with ctx.checkpoint.store_path({"steps_completed": step + 1}) as (path, uuid):
                    ...
                return

This package imports only the standard library (never torch), so it loads fast.
"""

from __future__ import annotations

from cairn.core._checkpoint import CheckpointContext, DownloadMode
from cairn.core._context import Context, InvalidHP, init
from cairn.core._distributed import DistributedContext, DummyDistributedContext
from cairn.core._info import ClusterInfo, TrialInfo, get_cluster_info
from cairn.core._preempt import PreemptContext, PreemptMode
from cairn.core._profiler import ProfilerContext
from cairn.core._searcher import SearcherContext, SearcherMode, SearcherOperation, Unit
from cairn.core._train import EarlyExitReason, TensorboardMode, TrainContext

__all__ = [
    "CheckpointContext",
    "ClusterInfo",
    "Context",
    "DistributedContext",
    "DownloadMode",
    "DummyDistributedContext",
    "EarlyExitReason",
    "InvalidHP",
    "PreemptContext",
    "PreemptMode",
    "ProfilerContext",
    "SearcherContext",
    "SearcherMode",
    "SearcherOperation",
    "TensorboardMode",
    "TrainContext",
    "TrialInfo",
    "Unit",
    "get_cluster_info",
    "init",
]
