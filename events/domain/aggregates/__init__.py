"""Pure folds of cairn's aggregates: one per aggregate, used by every consumer.

Each fold takes recorded events (upcast at the read boundary by
:func:`events.log.store.row_to_event`), decoded into their current models, and keeps a plain
state object. Folds read no clock, RNG or database, so the state at any position of the log is
the fold of the events up to it: the API answers both "now" and "as it was at position p" with
the same code, and the scheduler plans on the same states. State changes go through
:mod:`events.domain.lifecycle`'s rules: a change the state machine refuses is skipped, never
applied. The event types each fold reads are listed beside it (``*_FACTS``), so a reader can
fetch only those; a fold ignores any other type it is given.

Map:

- :mod:`~events.domain.aggregates.experiment`: config and typed settings, owner, state,
  requested trials (:class:`ExperimentView`).
- :mod:`~events.domain.aggregates.trial`: runs (allocations), the current run, restarts,
  checkpoint, stop/kill requests, state (:class:`TrialView`).
- :mod:`~events.domain.aggregates.summary`: a trial as the trial list shows it (the trial fold
  plus progress and metrics).
- :mod:`~events.domain.aggregates.task`: a task (a command today): its request, its one
  allocation, start, kill request and exit (:class:`TaskView`).
- :mod:`~events.domain.aggregates.agent`: registration, leaving, lost, disabled slots
  (:class:`AgentView`).
- :mod:`~events.domain.aggregates.model`: a registered model, its fields and numbered
  versions (:class:`ModelView`).
- :mod:`~events.domain.aggregates.rendezvous`: the rendezvous of a run on several agents (its
  joins, node ranks and chief; :class:`Rendezvous`).
- :mod:`~events.domain.aggregates.cluster`: all of them at once, with the links between them
  (:class:`Cluster`: what the scheduler plans on).
"""

from __future__ import annotations

from events.domain.aggregates.agent import AGENT_FACTS, AgentView, apply_agent, fold_agent
from events.domain.aggregates.cluster import (
    CLUSTER_FACTS,
    CLUSTER_TYPES,
    Cluster,
    describe_agent,
    fold_cluster,
)
from events.domain.aggregates.common import iso
from events.domain.aggregates.experiment import (
    EXPERIMENT_FACTS,
    ExperimentView,
    SettingsChange,
    apply_experiment,
    apply_settings,
    fold_experiment,
)
from events.domain.aggregates.model import (
    MODEL_FACTS,
    ModelVersionView,
    ModelView,
    apply_model,
    fold_model,
)
from events.domain.aggregates.summary import (
    TRIAL_SUMMARY_FACTS,
    better,
    fold_trial_summary,
    metric_value,
)
from events.domain.aggregates.task import TASK_FACTS, TaskView, apply_task, fold_task
from events.domain.aggregates.trial import (
    TRIAL_FACTS,
    AllocationView,
    Starter,
    TrialView,
    apply_trial,
    fold_allocation,
    fold_trial,
)

__all__ = [
    "AGENT_FACTS",
    "CLUSTER_FACTS",
    "CLUSTER_TYPES",
    "EXPERIMENT_FACTS",
    "MODEL_FACTS",
    "TASK_FACTS",
    "TRIAL_FACTS",
    "TRIAL_SUMMARY_FACTS",
    "AgentView",
    "AllocationView",
    "Cluster",
    "ExperimentView",
    "ModelVersionView",
    "ModelView",
    "SettingsChange",
    "Starter",
    "TaskView",
    "TrialView",
    "apply_agent",
    "apply_experiment",
    "apply_model",
    "apply_settings",
    "apply_task",
    "apply_trial",
    "better",
    "describe_agent",
    "fold_agent",
    "fold_allocation",
    "fold_cluster",
    "fold_experiment",
    "fold_model",
    "fold_task",
    "fold_trial",
    "fold_trial_summary",
    "iso",
    "metric_value",
]
