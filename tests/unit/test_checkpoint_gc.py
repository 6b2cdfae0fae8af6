"""The checkpoint GC's selection rule against Determined's worked table (reference §1.5)."""

from __future__ import annotations

import pytest

from events.log.limits import MAX_EVENT_BYTES, encoded
from events.log.registry import encode
from services.tracker.gc import (
    CheckpointInfo,
    ExperimentCheckpoints,
    GCConsumer,
    GCPolicy,
    Removal,
    select_for_deletion,
)

# Trial 1 saves checkpoints 1..5, trial 2 checkpoints 6..10, in step order; the validation
# metric (smaller is better) of each checkpoint's step, or None.
METRICS: dict[int, float | None] = {
    1: None,
    2: None,
    3: 0.6,
    4: 0.5,
    5: 0.4,
    6: None,
    7: 0.2,
    8: 0.3,
    9: None,
    10: None,
}
ALL = set(METRICS)


def oracle_checkpoints(sign: float = 1.0) -> list[CheckpointInfo]:
    out = []
    for n, metric in METRICS.items():
        trial = 11 if n <= 5 else 12
        value = None if metric is None else sign * metric
        out.append(CheckpointInfo(str(n), trial, steps_completed=100 * n, searcher_metric=value))
    return out


ORACLE = [
    ((0, 0, 0), set()),
    ((2, 0, 0), {8, 7}),
    ((5, 0, 0), {8, 7, 5, 4, 3}),
    ((10, 0, 0), {8, 7, 5, 4, 3}),
    ((0, 1, 0), {7, 5}),
    ((0, 3, 0), {8, 7, 5, 4, 3}),
    ((0, 7, 0), {8, 7, 5, 4, 3}),
    ((0, 0, 1), {10, 5}),
    ((0, 0, 3), {10, 9, 8, 5, 4, 3}),
    ((2, 1, 0), {8, 7, 5}),
    ((2, 0, 1), {10, 8, 7, 5}),
    ((0, 1, 1), {10, 7, 5}),
    ((2, 1, 1), {10, 8, 7, 5}),
]


@pytest.mark.parametrize(("policy", "kept"), ORACLE, ids=[str(p) for p, _ in ORACLE])
def test_oracle_table(policy: tuple[int, int, int], kept: set[int]) -> None:
    """Each (save_experiment_best, save_trial_best, save_trial_latest) keeps exactly Determined's set."""
    deleted = select_for_deletion(oracle_checkpoints(), GCPolicy(*policy), smaller_is_better=True)
    assert {int(u) for u in deleted} == ALL - kept


@pytest.mark.parametrize(("policy", "kept"), ORACLE, ids=[str(p) for p, _ in ORACLE])
def test_oracle_table_larger_is_better(policy: tuple[int, int, int], kept: set[int]) -> None:
    """Negated metrics with smaller_is_better=False rank the same, so the same sets are kept."""
    deleted = select_for_deletion(
        oracle_checkpoints(-1.0), GCPolicy(*policy), smaller_is_better=False
    )
    assert {int(u) for u in deleted} == ALL - kept


def test_warm_starts_are_never_deleted() -> None:
    """A checkpoint some trial started from survives even a keep-nothing policy."""
    deleted = select_for_deletion(
        oracle_checkpoints(),
        GCPolicy(0, 0, 0),
        smaller_is_better=True,
        warm_starts=frozenset({"1", "8"}),
    )
    assert {int(u) for u in deleted} == ALL - {1, 8}


def test_ties_share_a_rank_like_sql_rank() -> None:
    """Equal metrics (and equal steps) tie: both are kept when either would be."""
    ckpts = [
        CheckpointInfo("a", 11, 10, 0.5),
        CheckpointInfo("b", 11, 20, 0.5),
        CheckpointInfo("c", 11, 30, 0.9),
        CheckpointInfo("d", 12, 30, None),
        CheckpointInfo("e", 12, 30, None),
    ]
    deleted = select_for_deletion(ckpts, GCPolicy(0, 1, 0), smaller_is_better=True)
    assert deleted == {"c", "d", "e"}
    deleted = select_for_deletion(ckpts, GCPolicy(0, 0, 1), smaller_is_better=True)
    assert deleted == {"a", "b"}


def test_policy_from_storage_defaults_and_values() -> None:
    """A storage config without GC fields gets Determined's 0/1/1; given fields are used."""
    assert GCPolicy.from_storage(None) == GCPolicy(0, 1, 1)
    assert GCPolicy.from_storage({"type": "shared_fs", "host_path": "/x"}) == GCPolicy(0, 1, 1)
    storage = {"save_experiment_best": 2, "save_trial_best": 0, "save_trial_latest": 3}
    assert GCPolicy.from_storage(storage) == GCPolicy(2, 0, 3)


def test_many_deletions_are_recorded_in_events_under_the_size_limit() -> None:
    """2,500 deleted checkpoints with the longest uuids become several CheckpointsDeleted,
    each well under the store's event size limit, naming every uuid once."""
    uuids = [f"{i:04d}" + "u" * 124 for i in range(2500)]
    removal = Removal(removed=uuids[:2000], missing=uuids[2000:])
    facts = ExperimentCheckpoints(experiment_id=1, version=3)
    events = GCConsumer._deleted(facts, removal, "gc")
    assert len(events) == 3
    payloads = [encode(e) for e in events]
    assert all(len(encoded(p)) < MAX_EVENT_BYTES // 2 for p in payloads)
    assert [u for p in payloads for u in p["uuids"]] == sorted(uuids)
    assert [u for p in payloads for u in p["missing"]] == uuids[2000:]
