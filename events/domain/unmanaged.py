"""Unmanaged runs: what a script started outside the cluster (``core_v2``) makes the log say.

An unmanaged experiment (``ExperimentSubmitted{unmanaged}``) has no searcher and no scheduler:
the API gateway is the only writer of its trials' lifecycle, and decides with the pure
functions here over the trial's folded stream (:class:`~events.domain.aggregates.TrialView`):

- :func:`request_trial` -- the first run naming an external trial id requests the trial;
- :func:`open_run` -- every run opens the trial's next run: ``SlotsAllocated`` with no slots
  (so it holds none and bills none) and ``TrialStarted``; a trial that had ended is ACTIVE
  again, and a run still open (its script died before its heartbeat timed out) is ended as
  lost first, so a trial has at most one live run;
- :func:`close_run` -- the script ends its run, completed or failed;
- :func:`expire_run` -- a run whose script went silent past the heartbeat timeout is ended as
  lost and the trial ERROR;
- :func:`refuse_run` -- why no run may open: the experiment has ended or is stopping.

Each returns the events to append (``[]`` when there is nothing to do), and the caller appends
them with the trial stream's folded version as ``expected_version``, so a run is closed at most
once even when two gateways decide at the same moment: the loser re-folds and finds it closed.
"""

from __future__ import annotations

from typing import Literal

from events.domain import lifecycle
from events.domain.aggregates import ExperimentView, TrialView
from events.domain.deciders import Refusal, conflict
from events.domain.names import allocation_id
from events.domain.types import (
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialStarted,
    TrialStateChanged,
)
from events.log.envelope import Event

UNMANAGED_AGENT = ""
"""The ``agent_id`` of an unmanaged run's ``TrialStarted``: no agent started it."""


def request_trial(
    *,
    experiment_id: int,
    trial_id: int,
    seq: int,
    external_id: str,
    hparams: dict[str, object],
) -> TrialRequested:
    """The request of an unmanaged experiment's trial number ``seq`` named ``external_id``."""
    return TrialRequested(
        experiment_id=experiment_id,
        trial_id=trial_id,
        seq=seq,
        request_id=f"unmanaged-{seq}",
        hparams=dict(hparams),
        trial_seed=0,
        external_id=external_id,
    )


def refuse_run(experiment: ExperimentView) -> Refusal | None:
    """Why no run of unmanaged ``experiment`` may open now (conflict: it has ended or is
    stopping), or ``None``."""
    if experiment.state in lifecycle.ENDED or experiment.state in lifecycle.STOPPING:
        return conflict(f"experiment {experiment.experiment_id} has ended ({experiment.state})")
    return None


def live_run(trial: TrialView) -> int | None:
    """The run id of the trial's open run (allocated, not exited), or ``None``."""
    latest = trial.latest_allocation
    if latest is None or trial.allocations[latest].exited:
        return None
    return trial.allocations[latest].run_id


def _end(
    trial: TrialView,
    outcome: Literal["completed", "failed", "lost"],
    state: str,
    message: str,
    *,
    exit_code: int | None = None,
) -> list[Event]:
    latest = trial.latest_allocation
    assert latest is not None
    alloc = trial.allocations[latest]
    events: list[Event] = [
        TrialExited(
            trial_id=trial.trial_id,
            run_id=alloc.run_id,
            allocation_id=latest,
            outcome=outcome,
            exit_code=exit_code,
            message=message,
        ),
        SlotsReleased(trial_id=trial.trial_id, allocation_id=latest, placements={}),
    ]
    if lifecycle.next_trial_state(trial.state, state) not in (None, trial.state):
        events.append(TrialStateChanged(trial_id=trial.trial_id, state=state, reason=message))
    return events


def open_run(trial: TrialView) -> tuple[list[Event], int]:
    """The events that open the trial's next run, and that run's id.

    A run still open is ended first (lost: a new run of the same trial means its script is
    gone), and an ended trial is made ACTIVE again.
    """
    events: list[Event] = []
    previous = live_run(trial)
    state = trial.state
    if previous is not None:
        events += _end(trial, "lost", state, f"superseded by a new run of trial {trial.trial_id}")
    if state in lifecycle.TERMINAL:
        events.append(
            TrialStateChanged(trial_id=trial.trial_id, state=lifecycle.ACTIVE, reason="resumed")
        )
    run_id = max((a.run_id for a in trial.allocations.values()), default=0) + 1
    allocation = allocation_id(trial.trial_id, run_id)
    events += [
        SlotsAllocated(
            trial_id=trial.trial_id, allocation_id=allocation, placements={}, run_id=run_id
        ),
        TrialStarted(
            trial_id=trial.trial_id,
            allocation_id=allocation,
            run_id=run_id,
            agent_id=UNMANAGED_AGENT,
            restored_checkpoint=trial.latest_checkpoint.uuid if trial.latest_checkpoint else None,
        ),
    ]
    return events, run_id


def close_run(
    trial: TrialView, run_id: int, *, failed: bool, message: str = "", exit_code: int | None = None
) -> list[Event]:
    """The events that end run ``run_id`` as its script reported (``[]``: it is not the open
    run, so it was closed already, superseded or expired)."""
    if live_run(trial) != run_id:
        return []
    if failed:
        return _end(
            trial, "failed", lifecycle.ERROR, message or "the script failed", exit_code=exit_code
        )
    return _end(trial, "completed", lifecycle.COMPLETED, message, exit_code=exit_code)


def expire_run(trial: TrialView, run_id: int, *, silent_seconds: float) -> list[Event]:
    """The events that end run ``run_id`` whose script was silent for ``silent_seconds`` (past
    the heartbeat timeout; ``[]`` when it is no longer the open run)."""
    if live_run(trial) != run_id:
        return []
    return _end(
        trial,
        "lost",
        lifecycle.ERROR,
        f"no heartbeat from the script for {silent_seconds:.0f}s: it is presumed dead",
    )
