"""Which run of a trial may still report.

A trial's *current run* is the run of its latest ``SlotsAllocated``, from that allocation until
its ``TrialExited`` is recorded. Training reports (metrics, checkpoints, progress, early exit)
are accepted only for the current run, and only while neither the trial nor its experiment has
ended (the states of :mod:`events.domain.lifecycle`); a run's last report before it exits is therefore
accepted, and anything from a finished trial's token, or naming a run that never existed or has
exited, is refused with a 409. Log lines are output, not results: the agent may still ship a
run's last lines after it exited, so logs only need an allocation the scheduler made.

Every such 409 carries ``"reason": "run_not_current"`` in its error object: training code (the Core
API) stops its process when it sees it, since nothing that process reports will be accepted again.

The rules are :mod:`events.domain.deciders.trial_reports`'s; this module folds what they decide
over. Checked in the transaction that appends, after :meth:`~events.log.store.Transaction.lock_appends`,
so no ``TrialExited`` can be committed between the check and the append.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.domain.deciders.trial_reports import RUN_NOT_CURRENT as RUN_NOT_CURRENT
from events.domain.deciders.trial_reports import current_run, refuse_run
from events.domain.names import experiment_stream, trial_stream
from services.api.decided import accepted, refusal_error
from services.api.errors import ApiError, conflict, not_found
from services.api.views import (
    AllocationView,
    Reader,
    TrialView,
    experiment_of,
    fold_experiment,
    fold_trial,
)


def not_current(message: str, path: str | None = None) -> ApiError:
    """A 409 refusing a report from a run that is not (or no longer) the trial's current run."""
    return ApiError(409, message, path=path, details={"reason": RUN_NOT_CURRENT})


@dataclass
class RunState:
    """A trial's runs and the lifecycle states of the trial and its experiment.

    Attributes:
        trial: the trial's allocations (which exited) and its latest one.
        trial_state: the trial's state.
        experiment_state: its experiment's state.
    """

    trial: TrialView
    trial_state: str
    experiment_state: str

    @property
    def trial_id(self) -> int:
        """The trial's id."""
        return self.trial.trial_id

    def current(self) -> AllocationView:
        """The allocation of the current run.

        Raises:
            ApiError: 409 when the trial or its experiment has ended, or no run is live.
        """
        return accepted(current_run(self.trial, self.trial_state, self.experiment_state))

    def check_run(self, run_id: int, path: str) -> None:
        """Raises a 409 naming ``path`` unless ``run_id`` is the current run's."""
        refused = refuse_run(self.trial, self.current(), run_id, path)
        if refused is not None:
            raise refusal_error(refused)

    def check_allocation(self, allocation_id: str, *, live: bool) -> None:
        """Raises a 409 unless the scheduler made ``allocation_id`` (and, with ``live``, it is
        the current run's)."""
        if allocation_id not in self.trial.allocations:
            raise conflict(f"no allocation {allocation_id} was made for trial {self.trial_id}")
        if live and self.current().allocation_id != allocation_id:
            raise not_current(f"allocation {allocation_id} is not trial {self.trial_id}'s live run")


async def load_run_state(reader: Reader, trial_id: int) -> RunState:
    """Folds the lifecycle facts of ``trial_id`` and its experiment; 404 for a trial that has
    no stream."""
    streams = [trial_stream(trial_id), experiment_stream(await experiment_of(reader, trial_id))]
    events = await reader.read_lifecycle(streams)
    trial_events = [e for e in events if e.stream_id == streams[0]]
    if not trial_events and not await reader.stream_version(streams[0]):
        raise not_found(f"no trial {trial_id}")
    trial = fold_trial(trial_id, trial_events)
    experiment = fold_experiment(0, (e for e in events if e.stream_id == streams[1]))
    return RunState(trial=trial, trial_state=trial.state, experiment_state=experiment.state)
