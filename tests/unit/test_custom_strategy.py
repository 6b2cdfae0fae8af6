"""A custom search as the searcher's fold sees it: calls recorded, answers applied under the
search's rules, the search open while an answer is owed; no user code runs here."""

from __future__ import annotations

from typing import Any

import pytest

from events.domain.config import parse_config
from events.domain.search import (
    Create,
    SearchContext,
    SearcherError,
    SearchMethod,
    Shutdown,
    Stop,
    make_method,
)
from events.domain.search.custom import CustomStrategy

CONFIG: dict[str, Any] = {
    "name": "custom",
    "entrypoint": "python3 train.py",
    "hyperparameters": {"lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
    "searcher": {
        "name": "custom",
        "metric": "validation_loss",
        "searcher_class": "mine:Search",
        "max_trials": 2,
    },
    "reproducibility": {"experiment_seed": 5},
}


def search() -> tuple[SearchMethod, CustomStrategy]:
    """A fresh custom search and its strategy."""
    strategy = CustomStrategy(CONFIG, seed=5, code_ref="sha256:x", max_trials=2)
    return make_method(parse_config(CONFIG), strategy), strategy


def create(request_id: str) -> dict[str, Any]:
    return {"op": "create", "request_id": request_id, "hparams": {"lr": 0.01}}


def test_inputs_become_numbered_calls_and_the_search_waits_for_their_answers() -> None:
    """Each input is a call that returns nothing at once; the search ends only after the last
    call's answer is folded and creates nothing."""
    method, strategy = search()
    assert method.initial_operations() == []
    assert strategy.calls == [{"call": "initial"}] and strategy.answers_due
    (first,) = method.on_answer(1, [create("r0001")])
    assert isinstance(first, Create) and first.hparams == {"lr": 0.01}
    assert method.on_validation("r0001", 0.5, 10.0) == []
    assert method.on_trial_closed("r0001") == []
    assert [c["call"] for c in strategy.calls] == ["initial", "validation", "exited"]
    assert method.on_answer(2, []) == [], "a call is still owed: the search stays open"
    assert method.on_answer(3, []) == [Shutdown()]


def test_answers_fold_in_call_order_only() -> None:
    """An answer to a call that is not the next owed one is refused."""
    method, _ = search()
    method.initial_operations()
    with pytest.raises(SearcherError, match="answer to call 2"):
        method.on_answer(2, [])


def test_a_stop_of_a_trial_that_ended_after_the_call_is_dropped_but_one_it_knew_ended_fails() -> (
    None
):
    """A stop racing the trial's end (the end came after the call was asked) is dropped; a stop
    of a trial the method had been told had exited fails the search."""
    method, strategy = search()
    method.initial_operations()
    method.on_answer(1, [create("r0001"), create("r0002")])
    method.on_validation("r0001", 0.5, 10.0)  # call 2
    method.on_trial_closed("r0001")  # call 3: r0001 exited after call 2 was asked
    assert method.on_answer(2, [{"op": "stop", "request_id": "r0001"}]) == []
    assert strategy.failure is None
    method.on_answer(3, [{"op": "stop", "request_id": "r0002"}])
    method.on_validation("r0002", 0.4, 10.0)  # call 4
    assert strategy.failure is None
    method.on_answer(4, [{"op": "stop", "request_id": "r0001"}])
    assert (
        strategy.failure
        == "custom searcher mine:Search: on_validation stopped 'r0001', which had exited"
    )


def test_rules_broken_by_an_answer_fail_the_search() -> None:
    """A create past max_trials, a create out of order and an unknown stop each fail the search
    with the method's name in the reason."""
    cases = {
        "more than max_trials (2)": [create("r0001"), create("r0002"), create("r0003")],
        "created 'r0002' where 'r0001' was next": [create("r0002")],
        "stopped 'r0009', which it never created": [{"op": "stop", "request_id": "r0009"}],
    }
    for reason, ops in cases.items():
        method, strategy = search()
        method.initial_operations()
        decided = method.on_answer(1, ops)
        assert not any(isinstance(op, Create | Stop) for op in decided)
        assert strategy.failure is not None and reason in strategy.failure
        assert strategy.failure.startswith("custom searcher mine:Search: initial_operations")


def test_a_recorded_failure_ends_the_asking() -> None:
    """A recorded failure sets the reason as recorded; no later input becomes a call."""
    method, strategy = search()
    method.initial_operations()
    method.on_call_failed(1, "custom searcher mine:Search: initial_operations took more than 10 s")
    assert strategy.failure == "custom searcher mine:Search: initial_operations took more than 10 s"
    assert not strategy.answers_due
    strategy.validation(SearchContext(5, {}), "r0001", 0.1, None)  # a late input
    assert len(strategy.calls) == 1


def test_a_released_search_asks_nothing_more() -> None:
    """Once its experiment stops, the strategy forgets its calls and records no new one."""
    method, strategy = search()
    method.initial_operations()
    method.on_answer(1, [create("r0001")])
    strategy.release()
    assert method.on_trial_closed("r0001") in ([], [Shutdown()])
    assert strategy.calls == [] and not strategy.answers_due


def test_the_same_answers_make_the_same_decisions() -> None:
    """Two folds fed the same calls and answers decide the same trials, seeds included."""
    decided = []
    for _ in range(2):
        method, _ = search()
        method.initial_operations()
        ops = method.on_answer(
            1, [create("r0001"), {"op": "create", "request_id": "r0002", "hparams": {"lr": 0.02}}]
        )
        decided.append(
            [(op.request_id, op.hparams, op.trial_seed) for op in ops if isinstance(op, Create)]
        )
        assert not any(isinstance(op, Stop) for op in ops)
    assert decided[0] == decided[1] and len(decided[0]) == 2
