"""The trial's report intake: which run may still report, and what a batch of a run's reports
(metrics, checkpoints, progress, early exit, alerts) appends to the trial's stream.

A trial's *current run* is the run of its latest ``SlotsAllocated``, from that allocation until
its ``TrialExited``. Reports are accepted only from the current run and only while neither the
trial nor its experiment has ended; every other report is refused as a conflict with the code
:data:`RUN_NOT_CURRENT`, on which training code stops its process (nothing it reports would be
accepted again). A checkpoint uuid another trial recorded first is refused too.

The caller decides over state read after taking the append lock and claiming the batch's keys
in the inbox (repeats are dropped before deciding), so the checks still hold when it appends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from events.domain import lifecycle
from events.domain.aggregates import AllocationView, TrialView
from events.domain.deciders import Caused, Refusal, conflict
from events.domain.types import (
    CheckpointSaved,
    MetricsReported,
    TrialAlerted,
    TrialEarlyExited,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.envelope import Event

RUN_NOT_CURRENT = "run_not_current"
"""The ``code`` of a refusal of a report because its run may no longer report."""


def not_current(message: str, field: str | None = None) -> Refusal:
    """A conflict refusing a report from a run that is not (or no longer) the current one."""
    return conflict(message, field, code=RUN_NOT_CURRENT)


def current_run(
    trial: TrialView, trial_state: str, experiment_state: str
) -> AllocationView | Refusal:
    """The allocation of the trial's current run, or why no run may report (the trial or its
    experiment ended, the trial was never allocated slots, or its latest run exited)."""
    trial_id = trial.trial_id
    if trial_state in lifecycle.TERMINAL:
        return not_current(f"trial {trial_id} has ended ({trial_state})")
    if experiment_state in lifecycle.ENDED:
        return not_current(f"trial {trial_id}'s experiment has ended ({experiment_state})")
    latest = trial.latest_allocation
    if latest is None:
        return not_current(f"trial {trial_id} has no run: it was never allocated slots")
    alloc = trial.allocations[latest]
    if alloc.exited:
        return not_current(f"trial {trial_id} has no live run: run {alloc.run_id} exited")
    return alloc


def refuse_run(
    trial: TrialView, current: AllocationView, run_id: int, field: str
) -> Refusal | None:
    """Why run ``run_id`` (named at ``field``) may not report, given the ``current`` run's
    allocation, or ``None`` when it is the current run."""
    if run_id == current.run_id:
        return None
    known = any(a.run_id == run_id for a in trial.allocations.values())
    what = "has exited" if known else "never existed"
    return not_current(
        f"{field}: run {run_id} of trial {trial.trial_id} {what}; "
        f"its current run is {current.run_id}",
        field,
    )


# --- the reports ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportMetrics:
    """Metrics of ``group`` at ``steps_completed`` (``training`` -> ``WorkloadCompleted``,
    ``validation`` -> ``ValidationReported``, any other group -> ``MetricsReported``).

    Attributes:
        index: the item's position in its batch (refusals name ``items[index]``).
        key: the item's idempotency key, recorded as its event's causation id.
        run_id: the run it names (``None``: the current run).
    """

    index: int
    key: str
    group: str
    steps_completed: int
    metrics: Mapping[str, Any]
    run_id: int | None = None


@dataclass(frozen=True)
class ReportCheckpoint:
    """A complete checkpoint ``uuid`` (issued to the trial) with ``metadata.steps_completed``
    checked to be an integer."""

    index: int
    key: str
    uuid: str
    metadata: Mapping[str, Any]
    resources: Mapping[str, int] = field(default_factory=dict)
    run_id: int | None = None


@dataclass(frozen=True)
class ReportEarlyExit:
    """The training code stops the trial early, for ``reason``."""

    index: int
    key: str
    reason: Literal["invalid_hp", "user_requested_stop", "errored"]


@dataclass(frozen=True)
class ReportAlert:
    """An alert the training code raised."""

    index: int
    key: str
    title: str = ""
    description: str = ""
    level: Literal["warn", "info", "debug", "error"] = "info"
    run_id: int | None = None


@dataclass(frozen=True)
class ReportProgress:
    """Progress or a status text: kept in the gateway's tables, not the log, but like every
    report accepted only from the current run."""

    index: int
    key: str


TrialReport = ReportMetrics | ReportCheckpoint | ReportEarlyExit | ReportAlert | ReportProgress


@dataclass(frozen=True)
class ReportsState:
    """What a batch of reports is decided over.

    Attributes:
        trial: the trial's runs (which exited, the latest).
        trial_state: the trial's lifecycle state.
        experiment_state: its experiment's lifecycle state.
        checkpoint_owners: for each checkpoint uuid the batch names that some trial recorded,
            that trial's id.
    """

    trial: TrialView
    trial_state: str
    experiment_state: str
    checkpoint_owners: Mapping[str, int] = field(default_factory=dict)


def decide_reports(state: ReportsState, reports: Sequence[TrialReport]) -> list[Caused] | Refusal:
    """One event per report that has one (progress and status have none), in order, each
    caused by its item's key.

    Refused as a whole (nothing appended, nothing claimed) when the trial has no current run,
    a report names a run other than the current one, or a checkpoint uuid belongs to another
    trial (conflicts naming the item).
    """
    if not reports:
        return []
    current = current_run(state.trial, state.trial_state, state.experiment_state)
    if isinstance(current, Refusal):
        return current
    for report in reports:
        run_id = getattr(report, "run_id", None)
        if run_id is not None:
            refused = refuse_run(state.trial, current, run_id, f"items[{report.index}].run_id")
            if refused is not None:
                return refused
    trial_id = state.trial.trial_id
    for report in reports:
        if isinstance(report, ReportCheckpoint):
            owner = state.checkpoint_owners.get(report.uuid, trial_id)
            if owner != trial_id:
                path = f"items[{report.index}].uuid"
                return conflict(f"{path}: checkpoint {report.uuid} belongs to another trial", path)
    caused: list[Caused] = []
    for report in reports:
        event = _event_for(report, trial_id, current.run_id)
        if event is not None:
            caused.append(Caused(event, report.key))
    return caused


def _event_for(report: TrialReport, trial_id: int, run_id: int) -> Event | None:
    """The event of one accepted report (``run_id``: the current run, which every report names
    or defaults to)."""
    if isinstance(report, ReportMetrics):
        metrics = _scalars(report.metrics)
        if report.group in ("training", "validation"):
            kind = WorkloadCompleted if report.group == "training" else ValidationReported
            return kind(
                trial_id=trial_id,
                run_id=run_id,
                steps_completed=report.steps_completed,
                metrics=metrics,
            )
        return MetricsReported(
            trial_id=trial_id,
            run_id=run_id,
            group=report.group,
            steps_completed=report.steps_completed,
            metrics=metrics,
        )
    if isinstance(report, ReportCheckpoint):
        return CheckpointSaved(
            trial_id=trial_id,
            run_id=run_id,
            uuid=report.uuid,
            steps_completed=int(report.metadata["steps_completed"]),
            resources=dict(report.resources),
            metadata=_finite(dict(report.metadata)),
        )
    if isinstance(report, ReportEarlyExit):
        return TrialEarlyExited(trial_id=trial_id, reason=report.reason)
    if isinstance(report, ReportAlert):
        return TrialAlerted(
            trial_id=trial_id,
            run_id=run_id,
            title=report.title,
            description=report.description,
            level=report.level,
        )
    return None


def _finite(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become ``null`` (PostgreSQL's jsonb rejects them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric metrics, which are what events carry."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                out[key] = number
    return out
