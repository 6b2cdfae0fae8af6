"""A trial as the trial list shows it: the trial fold plus its reported progress and metrics."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from events.domain.aggregates.common import iso
from events.domain.aggregates.experiment import ExperimentView
from events.domain.aggregates.trial import TRIAL_FACTS, TrialView, apply_trial
from events.domain.types import MetricsReported, ValidationReported, WorkloadCompleted
from events.log.envelope import RecordedEvent

TRIAL_SUMMARY_FACTS = (*TRIAL_FACTS, "WorkloadCompleted", "ValidationReported", "MetricsReported")
"""What :func:`fold_trial_summary` reads."""

_REPORTS = frozenset(("WorkloadCompleted", "ValidationReported", "MetricsReported"))


def metric_value(metrics: Mapping[str, Any], name: str | None) -> float | None:
    """The finite numeric value of metric ``name`` in ``metrics`` (``None`` if absent)."""
    if not name:
        return None
    value = metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def better(value: float, best: float | None, smaller_is_better: bool) -> bool:
    """Whether ``value`` beats ``best`` (any value beats none)."""
    return best is None or (value < best if smaller_is_better else value > best)


def fold_trial_summary(
    experiment: ExperimentView, trial_id: int, events: Iterable[RecordedEvent]
) -> dict[str, Any]:
    """A trial as the trial list shows it (the shape of the tracker's ``tr_trials`` row),
    folded from its ``TrialRequested`` in ``experiment`` and its own stream's events.

    Steps completed follow Determined's rollback: a run reporting at step s while an earlier
    run had reported beyond s puts the trial back at s.
    """
    summary = experiment.requested_trial(trial_id)
    metric_name = experiment.settings.metric
    trial = TrialView(trial_id)
    run_steps: dict[int, int] = {}
    for recorded in events:
        if recorded.type not in _REPORTS:
            apply_trial(trial, recorded)
            continue
        event = recorded.decode()
        assert isinstance(event, WorkloadCompleted | ValidationReported | MetricsReported)
        steps = event.steps_completed
        rolled_back = any(s > steps for r, s in run_steps.items() if r < event.run_id)
        for run in [r for r in run_steps if r < event.run_id]:
            run_steps[run] = min(run_steps[run], steps)
        run_steps[event.run_id] = max(run_steps.get(event.run_id, steps), steps)
        summary["steps_completed"] = (
            steps if rolled_back else max(summary["steps_completed"], steps)
        )
        if isinstance(event, ValidationReported):
            summary["latest_validation"] = {
                "run_id": event.run_id,
                "steps_completed": event.steps_completed,
                "metrics": dict(event.metrics),
            }
            value = metric_value(event.metrics, metric_name)
            if value is not None and better(
                value, summary["best_metric"], experiment.smaller_is_better
            ):
                summary["best_metric"] = value
    summary["run_id"] = max((a.run_id for a in trial.allocations.values()), default=0)
    summary["restarts"] = trial.restarts
    checkpoint = trial.latest_checkpoint
    summary["latest_checkpoint"] = checkpoint.uuid if checkpoint is not None else None
    summary["state"] = trial.state
    summary["started_at"] = iso(trial.started_at)
    summary["ended_at"] = iso(trial.ended_at)
    return summary
