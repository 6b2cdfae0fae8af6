"""A user's changes after submission, folded by the scheduler and the searcher: priority,
max_slots and continuing an ended experiment (pure folds and the planner, no I/O)."""

from __future__ import annotations

import pytest

from events.domain.config import parse_config
from events.domain.search import Create, SearcherError, Shutdown, make_method
from events.domain.types import (
    ContinuedTrial,
    ExperimentContinued,
    ExperimentResourcesChanged,
    ExperimentStateChanged,
    TrialStateChanged,
)
from services.scheduler.state import ClusterState
from tests.unit.test_planner import Log, agent, exit_run, experiment, types


def change(log: Log, exp: int, **resources: int | float | None) -> None:
    log.add(
        f"experiment-{exp}",
        ExperimentResourcesChanged(experiment_id=exp, resources=resources),
    )


def test_raising_a_pending_experiments_priority_preempts_the_running_one() -> None:
    """Two priority-50 experiments on one slot: the second waits; set to priority 10 it
    preempts the first and runs once the first's run has exited."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1, priority=50)
    log.settle()
    experiment(log, 2, 1, priority=50)
    assert log.settle() == []
    change(log, 2, priority=10)
    assert log.state.experiments[2].settings.priority == 10
    made = log.settle()
    assert types(made) == ["PreemptionRequested"] and made[0].trial_id == 11  # type: ignore[attr-defined]
    exit_run(log, 11, 1, "preempted")
    made = log.settle()
    assert ("SlotsAllocated", 21) in [(e.event_type, getattr(e, "trial_id", "")) for e in made]


def test_max_slots_change_caps_and_uncaps_an_experiment() -> None:
    """max_slots 1 holds an experiment to one running trial; lifting the cap (null) lets the
    second trial in; a priority reset to null falls back to the default 42."""
    log = Log()
    agent(log, "a", 2)
    experiment(log, 1, 2, max_slots=1)
    assert types(log.settle()) == ["SlotsAllocated"]
    change(log, 1, max_slots=None, priority=None, weight=3.0)
    exp = log.state.experiments[1]
    assert (exp.settings.max_slots, exp.settings.priority, exp.settings.weight) == (None, 42, 3.0)
    assert types(log.settle()) == ["SlotsAllocated"]


def test_replay_folds_resource_changes_to_the_same_state() -> None:
    """Folding the same events again (a restarted scheduler) gives the same priorities and caps."""
    log = Log()
    experiment(log, 1, 1, priority=50)
    change(log, 1, priority=5, max_slots=4)
    replayed = ClusterState()
    for event in log.events:
        replayed.apply(event)
    assert replayed.experiments[1] == log.state.experiments[1]
    assert (
        replayed.experiments[1].settings.priority,
        replayed.experiments[1].settings.max_slots,
    ) == (5, 4)


def test_continued_trial_is_allocated_again_with_a_fresh_restart_budget() -> None:
    """After an experiment ended, ExperimentContinued plus the trial's ACTIVE state change make
    the scheduler allocate the trial's next run, and it ends the experiment again afterwards."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1)
    log.settle()
    exit_run(log, 11, 1, "completed")
    log.settle()
    log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="STOPPING_COMPLETED"))
    log.settle()
    assert log.state.experiments[1].state == "COMPLETED"
    assert log.step() == []

    config = {"resources": {"slots_per_trial": 1}, "max_restarts": 2}
    log.add(
        "experiment-1",
        ExperimentContinued(
            experiment_id=1, trials=[ContinuedTrial(trial_id=11, hparams={})], config=config
        ),
    )
    log.add("trial-11", TrialStateChanged(trial_id=11, state="ACTIVE", reason="continued"))
    assert log.state.experiments[1].settings.max_restarts == 2
    made = log.settle()
    assert types(made) == ["SlotsAllocated"] and made[0].run_id == 2  # type: ignore[attr-defined]
    exit_run(log, 11, 2, "completed")
    log.settle()
    log.add("experiment-1", ExperimentStateChanged(experiment_id=1, state="STOPPING_COMPLETED"))
    assert types(log.settle()) == ["ExperimentStateChanged"]


def test_continued_experiment_is_ignored_unless_it_ended() -> None:
    """ExperimentContinued of a running experiment changes nothing (the folds refuse it)."""
    log = Log()
    experiment(log, 1, 1)
    log.add(
        "experiment-1",
        ExperimentContinued(
            experiment_id=1, trials=[ContinuedTrial(trial_id=11, hparams={})], config={}
        ),
    )
    assert log.state.experiments[1].state == "ACTIVE"


def test_single_search_reopens_a_continued_trial_and_shuts_down_again() -> None:
    """A single search that shut down takes its trial back when continued, and shuts down once
    more when the trial closes again; an ASHA search cannot take a trial back."""
    method = make_method(parse_config("searcher: {name: single, metric: loss}\n", default_seed=3))
    [create] = method.initial_operations()
    assert isinstance(create, Create)
    request_id = create.request_id
    assert [type(op) for op in method.on_trial_closed(request_id)] == [Shutdown]
    method.on_trial_continued(request_id)
    assert not method.is_shutdown and method.running == 1
    assert [type(op) for op in method.on_trial_closed(request_id)] == [Shutdown]

    asha = make_method(
        parse_config(
            "searcher: {name: async_halving, metric: loss, max_trials: 4, num_rungs: 2,\n"
            "           divisor: 2, time_metric: batches, max_time: 8}\n"
            "hyperparameters: {x: {type: int, minval: 1, maxval: 9}}\n",
            default_seed=3,
        )
    )
    first = asha.initial_operations()[0]
    assert isinstance(first, Create)
    asha.on_trial_closed(first.request_id)
    with pytest.raises(SearcherError):
        asha.on_trial_continued(first.request_id)
