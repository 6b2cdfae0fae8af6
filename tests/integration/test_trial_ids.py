"""Trial ids are cluster-wide integers the searcher takes from a sequence, and replay reads them
from the log."""

from __future__ import annotations

from typing import Any

from events.domain.names import trial_stream
from events.domain.types import ExperimentSubmitted, TrialStateChanged
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
from services.searcher.service import SearcherConsumer

GRID: dict[str, Any] = {
    "name": "grid",
    "entrypoint": "python3 train.py",
    "hyperparameters": {"lr": {"type": "categorical", "vals": [0.1, 0.01, 0.001]}},
    "searcher": {"name": "grid", "metric": "loss", "max_length": 10, "max_concurrent_trials": 2},
}


async def requested(store: EventStore, experiment_id: int) -> list[dict[str, Any]]:
    stream = await store.read_stream(f"experiment-{experiment_id}")
    return [e.payload for e in stream if e.type == "TrialRequested"]


async def test_trial_ids_are_integers_unique_across_experiments(store: EventStore) -> None:
    """Two experiments' trials get distinct integer ids; each experiment numbers its own
    trials 1, 2, ... in ``seq``."""
    for experiment_id in (1, 2):
        submitted = ExperimentSubmitted(experiment_id=experiment_id, config=GRID)
        await store.append(f"experiment-{experiment_id}", [submitted])
    await ConsumerRunner(store, None, SearcherConsumer(store)).catch_up()
    first, second = await requested(store, 1), await requested(store, 2)
    assert [t["seq"] for t in first] == [1, 2] and [t["seq"] for t in second] == [1, 2]
    ids = [t["trial_id"] for t in first + second]
    assert all(type(i) is int and i > 0 for i in ids)
    assert len(set(ids)) == 4


async def test_replayed_searcher_reads_trial_ids_from_the_log(store: EventStore) -> None:
    """A restarted searcher takes each trial's id from its recorded ``TrialRequested`` (the
    sequence has moved on meanwhile), and only a new decision draws a new one."""
    await store.append("experiment-1", [ExperimentSubmitted(experiment_id=1, config=GRID)])
    await ConsumerRunner(store, None, SearcherConsumer(store)).catch_up()
    before = await requested(store, 1)
    assert len(before) == 2
    await store.execute("SELECT setval('trial_ids', 1000)")

    searcher = SearcherConsumer(store)  # a fresh process: it knows only the log
    await searcher.rebuild()
    closed = before[0]["trial_id"]
    await store.append(
        trial_stream(closed), [TrialStateChanged(trial_id=closed, state="COMPLETED")]
    )
    await ConsumerRunner(store, None, searcher).catch_up()
    assert searcher.experiment_of == {t["trial_id"]: 1 for t in before} | {1001: 1}
    after = await requested(store, 1)
    assert after[:2] == before
    assert [(t["trial_id"], t["seq"]) for t in after[2:]] == [(1001, 3)]
