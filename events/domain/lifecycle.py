"""Experiment and trial states and their state machines (Determined's names and rules).

This module is the one vocabulary of lifecycle states (the names, the stopping, terminal and
ended sets) and the one rule set for changing them. Writers call ``check_*``, which refuses an
illegal transition with :class:`IllegalTransitionError`, before they append. The folds of
:mod:`events.domain.aggregates` (which the API, the scheduler, the searcher and the log checker
all apply) and the tracker's projections ask ``next_*_state`` what a recorded
``ExperimentStateChanged`` / ``TrialStateChanged`` makes the state, and a change it refuses is
skipped, never applied: the same stream folds to the same state in every consumer, and a bad
write can never corrupt a folded state.
"""

from __future__ import annotations

from events.log.errors import EventsError

ACTIVE, PAUSED = "ACTIVE", "PAUSED"
STOPPING_COMPLETED, STOPPING_CANCELED = "STOPPING_COMPLETED", "STOPPING_CANCELED"
STOPPING_KILLED, STOPPING_ERROR = "STOPPING_KILLED", "STOPPING_ERROR"
COMPLETED, CANCELED, ERROR = "COMPLETED", "CANCELED", "ERROR"
DELETING, DELETED, DELETE_FAILED = "DELETING", "DELETED", "DELETE_FAILED"

STOPPING = frozenset({STOPPING_COMPLETED, STOPPING_CANCELED, STOPPING_KILLED, STOPPING_ERROR})
TERMINAL = frozenset({COMPLETED, CANCELED, ERROR})
DELETION = frozenset({DELETING, DELETED, DELETE_FAILED})
"""States of an experiment being, or having been, deleted (its settings no longer change)."""
ENDED = TERMINAL | DELETION
"""States after which an experiment or trial never runs again (ended, or being or been deleted)."""
STATES = frozenset({ACTIVE, PAUSED, DELETING, DELETED, DELETE_FAILED}) | STOPPING | TERMINAL
# A stopping state ends in this terminal state.
STOPPED = {
    STOPPING_COMPLETED: COMPLETED,
    STOPPING_CANCELED: CANCELED,
    STOPPING_KILLED: CANCELED,
    STOPPING_ERROR: ERROR,
}
# Stopping states only degrade: COMPLETED < CANCELED < KILLED < ERROR.
SEVERITY = {STOPPING_COMPLETED: 0, STOPPING_CANCELED: 1, STOPPING_KILLED: 2, STOPPING_ERROR: 3}

EXPERIMENT_TRANSITIONS: dict[str, frozenset[str]] = {
    ACTIVE: frozenset({PAUSED, ERROR}) | STOPPING,
    PAUSED: frozenset({ACTIVE, ERROR}) | STOPPING,
    STOPPING_CANCELED: frozenset({CANCELED, STOPPING_KILLED, STOPPING_ERROR, ERROR}),
    STOPPING_KILLED: frozenset({CANCELED, STOPPING_ERROR, ERROR}),
    STOPPING_COMPLETED: frozenset({COMPLETED, STOPPING_ERROR, ERROR}),
    STOPPING_ERROR: frozenset({ACTIVE, ERROR}),
    COMPLETED: frozenset({DELETING}),
    CANCELED: frozenset({DELETING}),
    ERROR: frozenset({DELETING}),
    DELETING: frozenset({DELETED, DELETE_FAILED}),
    DELETE_FAILED: frozenset({DELETING}),
    DELETED: frozenset(),
}


class IllegalTransitionError(EventsError):
    """A state change the state machine does not allow."""

    def __init__(self, kind: str, current: str, target: str) -> None:
        super().__init__(f"{kind} cannot go from {current} to {target}")
        self.current = current
        self.target = target


def check_experiment(current: str, target: str) -> None:
    """Raises :class:`IllegalTransitionError` unless an experiment may go ``current -> target``."""
    if target not in STATES or target not in EXPERIMENT_TRANSITIONS.get(current, frozenset()):
        raise IllegalTransitionError("experiment", current, target)


def check_trial(current: str, target: str) -> None:
    """Raises :class:`IllegalTransitionError` unless a trial may go ``current -> target``.

    Trials follow the experiment's rules, except that ACTIVE may end directly (COMPLETED,
    CANCELED, ERROR), a terminal trial may be made ACTIVE again (continued), and a stopping
    trial only moves to a *more* severe stopping state.
    """
    if target not in STATES:
        raise IllegalTransitionError("trial", current, target)
    if current in STOPPING and target in STOPPING:
        if SEVERITY[target] <= SEVERITY[current]:
            raise IllegalTransitionError("trial", current, target)
        return
    allowed = set(EXPERIMENT_TRANSITIONS.get(current, frozenset()))
    if current in (ACTIVE, PAUSED):
        allowed |= TERMINAL
    if current in TERMINAL:
        allowed.add(ACTIVE)
    if target not in allowed:
        raise IllegalTransitionError("trial", current, target)


def next_experiment_state(current: str, target: str) -> str | None:
    """What a recorded change to ``target`` makes an experiment in state ``current``.

    Returns:
        ``target`` when the state machine allows ``current -> target``; ``None`` when it refuses
        the change (a fold skips it: nothing of the event is applied).
    """
    try:
        check_experiment(current, target)
    except IllegalTransitionError:
        return None
    return target


def next_trial_state(current: str, target: str) -> str | None:
    """What a recorded change to ``target`` makes a trial in state ``current``.

    A change to the state the trial is already in is allowed and changes nothing (the
    scheduler's ``requeue`` keeps an ACTIVE trial ACTIVE while it frees the trial's run).

    Returns:
        ``target`` when allowed; ``None`` when the state machine refuses the change.
    """
    if target == current:
        return current
    try:
        check_trial(current, target)
    except IllegalTransitionError:
        return None
    return target


def initial_experiment_state(activate: bool) -> str:
    """The state an ``ExperimentSubmitted`` puts an experiment in (PAUSED unless activated)."""
    return ACTIVE if activate else PAUSED


def can_continue(state: str) -> bool:
    """Whether ``ExperimentContinued`` applies to an experiment in ``state`` (only an ended one,
    COMPLETED, CANCELED or ERROR, is made ACTIVE again; in any other state the fact is refused)."""
    return state in TERMINAL
