"""Chart rollups (``services/tracker/series.py``): the series they serve equal a direct
downsample of the raw points at every width, they follow continued trials and late reports, and
a rebuild from position 0 (batched or one event at a time) writes them equal. Running trials'
kept buckets: ``test_series_kept.py``."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    TrialRequested,
    TrialStateChanged,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.store import EventStore
from services.tracker import projections, series
from services.tracker.series import SeriesBuckets
from services.tracker.service import catch_up
from tests.integration.test_api_support import Api, running_api, submit_experiment
from tests.integration.test_tracker import snapshot
from tests.integration.test_tracker_batch import one_by_one

LONG = 5000
"""The long trial's last step: its finest rollup is 8 steps wide (1024 buckets at most)."""


def curve(trial: int, run: int, step: int) -> float:
    """A falling, wiggling curve with a spike every 97 steps and a dip every 89."""
    if step % 97 == 0:
        return 40.0 + trial
    if step % 89 == 0:
        return -3.0 - run
    return 2.0 / (1.0 + 0.003 * trial * step) + 0.05 * math.sin(step * run)


def reports(trial: int, run: int, steps: range) -> list[ValidationReported | WorkloadCompleted]:
    """Validation ``loss`` at each step, and training ``loss``/``acc`` at every third."""
    out: list[ValidationReported | WorkloadCompleted] = []
    for s in steps:
        out.append(
            ValidationReported(
                trial_id=trial,
                run_id=run,
                steps_completed=s,
                metrics={"loss": curve(trial, run, s)},
            )
        )
        if s % 3 == 0:
            out.append(
                WorkloadCompleted(
                    trial_id=trial,
                    run_id=run,
                    steps_completed=s,
                    metrics={"loss": curve(trial, run, s) * 2, "acc": s % 11},
                )
            )
    return out


async def state(store: EventStore, trial: int, to: str) -> None:
    """Appends the trial's state change."""
    await store.append(trial_stream(trial), [TrialStateChanged(trial_id=trial, state=to)])


async def experiment(store: EventStore, tmp_path: Path) -> None:
    """Experiment 1: trial 11 restarted (run 2 rolls back run 1's steps past 40) and COMPLETED;
    trial 12 long and sparse, ERROR; trial 13 live; trial 14 CANCELED without a point."""
    await submit_experiment(store, 1)
    await store.append(
        experiment_stream(1),
        [
            TrialRequested(
                experiment_id=1,
                trial_id=t,
                seq=t - 10,
                request_id=f"r{t}",
                hparams={"lr": 0.01 * t},
                trial_seed=t,
            )
            for t in (11, 12, 13, 14)
        ],
    )
    await store.append(trial_stream(11), reports(11, 1, range(1, 121)))
    await store.append(trial_stream(11), reports(11, 2, range(41, 101)))
    await store.append(trial_stream(12), reports(12, 1, range(0, LONG + 1, 37)))
    await store.append(trial_stream(13), reports(13, 1, range(1, 61)))
    await state(store, 11, "COMPLETED")
    await state(store, 12, "ERROR")
    await state(store, 14, "CANCELED")
    await catch_up(store, checkpoint_root=tmp_path)


async def direct(store: EventStore, group: str, metric: str, width: int) -> list[SeriesBuckets]:
    """Experiment 1's series bucketed in Python from its unarchived points (the reference)."""
    rows = await store.fetch(
        """SELECT trial_id, steps_completed, metrics FROM tr_metrics
           WHERE experiment_id = 1 AND "group" = $1 AND NOT archived
           ORDER BY trial_id, steps_completed""",
        group,
    )
    buckets: dict[int, dict[int, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        value = r["metrics"].get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool):
            step = int(r["steps_completed"])
            buckets[int(r["trial_id"])][step // width].append((step, float(value)))
    out = []
    for trial, by_bucket in sorted(buckets.items()):
        found = SeriesBuckets(trial, group, metric, [], [], [], [])
        for _, pts in sorted(by_bucket.items()):
            found.firsts.append(min(x for x, _ in pts))
            found.lasts.append(max(x for x, _ in pts))
            found.lows.append(min(y for _, y in pts))
            found.highs.append(max(y for _, y in pts))
        out.append(found)
    return out


async def served(store: EventStore, group: str, metric: str, width: int) -> list[SeriesBuckets]:
    async with store.connection() as conn:
        return await series.experiment_series(conn, 1, group, metric, width)


async def width_for(store: EventStore, group: str, metric: str, buckets: int) -> int:
    async with store.connection() as conn:
        return await series.experiment_width(conn, 1, group, metric, buckets)


async def assert_served_equals_direct(store: EventStore) -> None:
    """At every chart width the API may ask for, the served series equal the direct ones."""
    for group, metric in (("validation", "loss"), ("training", "loss"), ("training", "acc")):
        widths = {await width_for(store, group, metric, b) for b in (2000, 300, 64, 16)}
        for width in sorted(widths | {16, 256, 4096}):
            assert await served(store, group, metric, width) == await direct(
                store, group, metric, width
            ), (group, metric, width)


async def rollup_trials(store: EventStore) -> set[int]:
    rows = await store.fetch("SELECT DISTINCT trial_id FROM tr_series_rollups")
    return {int(r["trial_id"]) for r in rows}


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


async def test_rollups_serve_what_a_direct_downsample_of_the_points_gives(
    store: EventStore, tmp_path: Path
) -> None:
    """Trials (restarted with a rollback, long and sparse, live) get rollups, one without a point
    does not; the chart never gets finer than an ended series' finest rollup, and at every width the
    served buckets equal bucketing the unarchived points directly."""
    await experiment(store, tmp_path)
    assert await rollup_trials(store) == {11, 12, 13}
    assert await width_for(store, "validation", "loss", 2000) == 8  # trial 12's finest
    assert await width_for(store, "validation", "loss", 16) == 512
    # Every metric gets a rollup at widths that are powers of two.
    rows = await store.fetch("SELECT DISTINCT metric, width FROM tr_series_rollups")
    assert {r["metric"] for r in rows} == {"loss", "acc"}
    assert all(r["width"] & (r["width"] - 1) == 0 for r in rows)
    await assert_served_equals_direct(store)
    # The rolled-back points of trial 11's run 1 are not in its rollup: only run 2's values
    # appear past step 40.
    mixed = await served(store, "validation", "loss", 1)
    eleven = next(s for s in mixed if s.trial_id == 11)
    assert eleven.lows[eleven.firsts.index(60)] == curve(11, 2, 60)
    # A trial that ended before rollups existed (none stored) is read from its points.
    await store.execute("DELETE FROM tr_series_rollups WHERE trial_id = 11")
    await assert_served_equals_direct(store)


async def test_continued_and_late_reported_trials_never_serve_stale_rollups(
    store: EventStore, tmp_path: Path, api: Api
) -> None:
    """A continued trial keeps its rollup, which its new points (rolling some back) bring up to
    date, and recomputes it when it ends again; a report for an ended trial updates its rollup;
    the API's chart shows the new values in each case."""
    await experiment(store, tmp_path)
    await state(store, 11, "ACTIVE")
    await catch_up(store, checkpoint_root=tmp_path)
    assert await rollup_trials(store) == {11, 12, 13}
    await store.append(trial_stream(11), reports(11, 3, range(90, 181)))
    await catch_up(store, checkpoint_root=tmp_path)
    await assert_served_equals_direct(store)
    await state(store, 11, "COMPLETED")
    late = ValidationReported(
        trial_id=12, run_id=1, steps_completed=LONG + 3, metrics={"loss": -77.0}
    )
    await store.append(trial_stream(12), [late])
    await catch_up(store, checkpoint_root=tmp_path)
    assert await rollup_trials(store) == {11, 12, 13}
    await assert_served_equals_direct(store)
    body = await api.ok(
        "GET", "/api/v1/experiments/1/series?metric=loss&group=validation&buckets=2000", api.admin
    )
    by_trial = {t["trial_id"]: t for t in body["trials"]}
    assert sorted(by_trial) == [11, 12, 13]
    assert by_trial[12]["steps"][-1] == LONG + 3 and by_trial[12]["values"][-1] == -77.0
    assert by_trial[11]["steps"][-1] == 180
    assert curve(11, 3, 178) == -6.0 and -6.0 in by_trial[11]["values"]  # run 3's dip


async def test_rebuilds_write_the_live_rollups(store: EventStore, tmp_path: Path) -> None:
    """A rebuild from position 0, and applying the log one event at a time, give rollups (and
    every other projection) equal to the live ones, continued trial included."""
    await experiment(store, tmp_path)
    await state(store, 11, "ACTIVE")
    await store.append(trial_stream(11), reports(11, 3, range(90, 130)))
    await state(store, 11, "CANCELED")
    await catch_up(store, checkpoint_root=tmp_path)
    live = await snapshot(store)
    assert {r["trial_id"] for r in live["tr_series_rollups"]} == {11, 12, 13}
    await projections.rebuild(store)
    assert await snapshot(store) == live
    assert await one_by_one(store) == live
