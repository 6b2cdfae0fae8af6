"""The trial's report intake (:mod:`events.domain.deciders.trial_reports`): which run may
report, and what a batch of reports appends; no HTTP, no database."""

from __future__ import annotations

import math

import pytest

from events.domain import lifecycle
from events.domain.aggregates import AllocationView, TrialView
from events.domain.deciders import Caused, Refusal
from events.domain.deciders.trial_reports import (
    RUN_NOT_CURRENT,
    ReportAlert,
    ReportCheckpoint,
    ReportEarlyExit,
    ReportMetrics,
    ReportProgress,
    ReportsState,
    decide_reports,
)
from events.domain.types import (
    CheckpointSaved,
    MetricsReported,
    TrialAlerted,
    TrialEarlyExited,
    ValidationReported,
    WorkloadCompleted,
)

TRIAL = 30


def trial(*, exited: bool = False, runs: int = 2) -> TrialView:
    """Trial ``TRIAL`` with runs 1..``runs``, all but the last exited (the last too if asked)."""
    allocations = {
        f"{TRIAL}.{r}": AllocationView(f"{TRIAL}.{r}", r, {"a1": ["0"]}, exited=r < runs or exited)
        for r in range(1, runs + 1)
    }
    return TrialView(TRIAL, allocations=allocations, latest_allocation=f"{TRIAL}.{runs}")


def state(view: TrialView | None = None, **fields: object) -> ReportsState:
    """The reports' state: an ACTIVE trial of an ACTIVE experiment, its run 2 live."""
    values: dict[str, object] = {
        "trial_state": lifecycle.ACTIVE,
        "experiment_state": lifecycle.ACTIVE,
    } | fields
    return ReportsState(view or trial(), **values)  # type: ignore[arg-type]


def test_each_report_becomes_its_event_on_the_current_run_caused_by_its_key() -> None:
    """Training, validation and other metrics, a checkpoint, an alert and an early exit become
    their events on run 2, in order, each caused by its key; progress has none; non-finite
    values are dropped from metrics and nulled in checkpoint metadata."""
    reports = [
        ReportMetrics(0, "k0", "training", 10, {"loss": 0.5, "bad": math.nan, "flag": True}),
        ReportMetrics(1, "k1", "validation", 10, {"acc": 0.9}, run_id=2),
        ReportMetrics(2, "k2", "gpu", 10, {"util": 3}),
        ReportProgress(3, "k3"),
        ReportCheckpoint(4, "k4", "c-1", {"steps_completed": 10, "x": math.inf}, {"f": 4}),
        ReportAlert(5, "k5", title="t", level="warn"),
        ReportEarlyExit(6, "k6", "user_requested_stop"),
    ]
    decision = decide_reports(state(), reports)
    assert decision == [
        Caused(
            WorkloadCompleted(trial_id=TRIAL, run_id=2, steps_completed=10, metrics={"loss": 0.5}),
            "k0",
        ),
        Caused(
            ValidationReported(trial_id=TRIAL, run_id=2, steps_completed=10, metrics={"acc": 0.9}),
            "k1",
        ),
        Caused(
            MetricsReported(
                trial_id=TRIAL, run_id=2, group="gpu", steps_completed=10, metrics={"util": 3.0}
            ),
            "k2",
        ),
        Caused(
            CheckpointSaved(
                trial_id=TRIAL,
                run_id=2,
                uuid="c-1",
                steps_completed=10,
                resources={"f": 4},
                metadata={"steps_completed": 10, "x": None},
            ),
            "k4",
        ),
        Caused(TrialAlerted(trial_id=TRIAL, run_id=2, title="t", level="warn"), "k5"),
        Caused(TrialEarlyExited(trial_id=TRIAL, reason="user_requested_stop"), "k6"),
    ]


def test_an_empty_batch_decides_nothing() -> None:
    """No reports, no events (and no refusal, even for an ended trial)."""
    assert decide_reports(state(trial_state=lifecycle.COMPLETED), []) == []


@pytest.mark.parametrize(
    ("reports_state", "message"),
    [
        (state(trial_state=lifecycle.COMPLETED), f"trial {TRIAL} has ended (COMPLETED)"),
        (state(experiment_state=lifecycle.DELETING), "experiment has ended (DELETING)"),
        (state(TrialView(TRIAL)), "it was never allocated slots"),
        (state(trial(exited=True)), "no live run: run 2 exited"),
    ],
)
def test_a_batch_without_a_current_run_is_refused_as_not_current(
    reports_state: ReportsState, message: str
) -> None:
    """An ended trial or experiment, a trial never allocated, or an exited run: even a progress
    report is refused, coded run_not_current."""
    decision = decide_reports(reports_state, [ReportProgress(0, "k")])
    assert isinstance(decision, Refusal)
    assert (decision.reason, decision.code) == ("conflict", RUN_NOT_CURRENT)
    assert message in decision.message


@pytest.mark.parametrize(("run_id", "what"), [(1, "has exited"), (9, "never existed")])
def test_a_report_naming_another_run_is_refused_at_its_item(run_id: int, what: str) -> None:
    """A report of an exited or unknown run refuses the whole batch, naming the item's run_id."""
    reports = [ReportProgress(0, "a"), ReportMetrics(1, "b", "training", 1, {}, run_id=run_id)]
    decision = decide_reports(state(), reports)
    assert decision == Refusal(
        "conflict",
        f"items[1].run_id: run {run_id} of trial {TRIAL} {what}; its current run is 2",
        "items[1].run_id",
        RUN_NOT_CURRENT,
    )


def test_a_checkpoint_another_trial_recorded_is_refused() -> None:
    """A uuid some other trial saved first refuses the batch at the item's uuid (no code: the
    run may go on reporting)."""
    report = ReportCheckpoint(3, "k", "c-9", {"steps_completed": 1})
    decision = decide_reports(state(checkpoint_owners={"c-9": TRIAL + 1}), [report])
    assert decision == Refusal(
        "conflict", "items[3].uuid: checkpoint c-9 belongs to another trial", "items[3].uuid"
    )
    assert isinstance(decide_reports(state(checkpoint_owners={"c-9": TRIAL}), [report]), list)
