"""Chart buckets kept while trials run (``series.keep_buckets``): after every page they equal
what ``series.roll_up`` computes from the trial's points, whatever the pages, rollbacks,
repeats and growing widths; a running trial's chart is read from them, not from its points,
and equals bucketing the points directly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from events.domain.names import experiment_stream, trial_stream
from events.domain.types import MetricsReported, TrialRequested, ValidationReported
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
from services.tracker import projections, schema, series
from tests.integration.test_api_support import submit_experiment
from tests.integration.test_series_rollups import curve, reports, state
from tests.integration.test_tracker import snapshot
from tests.integration.test_tracker_batch import one_by_one

TRIALS = (21, 22, 23)


class _Undo(Exception):
    """Raised to roll a transaction back."""


async def kept(store: EventStore) -> list[dict[str, Any]]:
    """The stored buckets, in key order."""
    rows = await store.fetch(
        """SELECT * FROM tr_series_rollups ORDER BY trial_id, "group", metric, width"""
    )
    return [dict(r) for r in rows]


async def recomputed(store: EventStore) -> list[dict[str, Any]]:
    """The buckets ``roll_up`` computes from every trial's current points (nothing is kept)."""
    found: list[dict[str, Any]] = []
    try:
        async with store.transaction() as tx:
            for trial in TRIALS:
                await series.roll_up(tx.conn, trial)
            rows = await tx.conn.fetch(
                """SELECT * FROM tr_series_rollups ORDER BY trial_id, "group", metric, width"""
            )
            found = [dict(r) for r in rows]
            raise _Undo
    except _Undo:
        pass
    return found


async def project(store: EventStore, page: int) -> None:
    """Projects the log to its head in pages of ``page`` events."""
    await ConsumerRunner(store, None, projections.ProjectionsConsumer(), batch=page).catch_up()


async def start(store: EventStore) -> None:
    """Experiment 1 with three trials, none ended."""
    await schema.migrate(store)
    await submit_experiment(store, 1)
    await store.append(
        experiment_stream(1),
        [
            TrialRequested(
                experiment_id=1,
                trial_id=t,
                seq=t - 20,
                request_id=f"r{t}",
                hparams={"lr": 0.01 * t},
                trial_seed=t,
            )
            for t in TRIALS
        ],
    )


def custom(trial: int, steps: list[int], value: float | None = None) -> list[MetricsReported]:
    """``custom`` reports of ``x`` (and of ``y`` at even steps) at ``steps``, in that order."""
    return [
        MetricsReported(
            trial_id=trial,
            run_id=1,
            steps_completed=s,
            group="custom",
            metrics={"x": curve(trial, 1, s) if value is None else value}
            | ({"y": -float(s)} if s % 2 == 0 else {}),
        )
        for s in steps
    ]


async def assert_kept_serve_the_points(store: EventStore) -> None:
    """The kept buckets equal a recomputation from the points, and every chart width served
    equals bucketing the points directly."""
    assert await kept(store) == await recomputed(store)
    async with store.connection() as conn:
        for group, metric in (("validation", "loss"), ("training", "acc"), ("custom", "x")):
            widths = {
                await series.experiment_width(conn, 1, group, metric, b) for b in (2000, 400, 16)
            }
            for width in sorted(widths | {4096}):
                served = await series.experiment_series(conn, 1, group, metric, width)
                raw = await series.raw_experiment_series(conn, 1, group, metric, width)
                assert served == raw, (group, metric, width)


async def test_running_trials_keep_buckets_equal_to_their_points(
    store: EventStore, tmp_path: Path
) -> None:
    """While trials run, pages of reports (widths growing with the steps, a rollback, a repeated
    step, reports out of step order, a new metric) keep buckets equal to a recomputation from
    the points; charts read them and equal the points bucketed directly; a rebuild, and the
    log applied one event at a time, write the same buckets."""
    await start(store)
    # Trial 21 grows to 3,000 steps in chunks: its stored widths change as its steps double.
    for low in range(1, 3001, 250):
        await store.append(trial_stream(21), reports(21, 1, range(low, low + 250)))
        await project(store, page=97)
        await assert_kept_serve_the_points(store)
    # Trial 22 restarts: run 2 rolls back run 1's steps past 150.
    await store.append(trial_stream(22), reports(22, 1, range(1, 301)))
    await project(store, page=500)
    await store.append(trial_stream(22), reports(22, 2, range(151, 401)))
    await project(store, page=64)
    await assert_kept_serve_the_points(store)
    # Trial 23: out of step order within a page, a repeated step with a new value, a metric
    # that appears late, and a group whose steps lag another's.
    await store.append(trial_stream(23), custom(23, [40, 10, 30, 20, 50]))
    await store.append(trial_stream(23), custom(23, [30], value=99.0))
    await store.append(trial_stream(23), reports(23, 1, range(1, 20)))
    await store.append(trial_stream(23), custom(23, [51, 52, 600]))
    await project(store, page=3)
    await assert_kept_serve_the_points(store)
    assert {r["trial_id"] for r in await kept(store)} == set(TRIALS)
    # A state change keeps them; the end recomputes them to the same rows.
    before = await kept(store)
    await state(store, 22, "PAUSED")
    await state(store, 23, "COMPLETED")
    await project(store, page=50)
    assert await kept(store) == before

    live = await snapshot(store)
    await projections.rebuild(store)
    assert await snapshot(store) == live
    assert await one_by_one(store) == live


async def test_a_running_trials_chart_is_read_from_its_kept_buckets(
    store: EventStore, tmp_path: Path
) -> None:
    """With every point's values wiped (in a transaction rolled back), the chart of running
    trials is unchanged: it is read from the kept buckets alone, and equals the raw answer."""
    await start(store)
    for trial in TRIALS:
        await store.append(trial_stream(trial), reports(trial, 1, range(1, 1500)))
    await project(store, page=500)
    async with store.connection() as conn:
        width = await series.experiment_width(conn, 1, "validation", "loss", 400)
        raw = await series.raw_experiment_series(conn, 1, "validation", "loss", width)
        assert await series.experiment_series(conn, 1, "validation", "loss", width) == raw
    assert len(raw) == len(TRIALS) and all(len(s.firsts) > 100 for s in raw)
    try:
        async with store.transaction() as tx:
            await tx.conn.execute("UPDATE tr_metrics SET metrics = '{}'::jsonb")
            assert await series.raw_experiment_series(tx.conn, 1, "validation", "loss", width) == []
            assert await series.experiment_series(tx.conn, 1, "validation", "loss", width) == raw
            raise _Undo
    except _Undo:
        pass


async def test_a_validation_alone_appends_to_the_kept_buckets(store: EventStore) -> None:
    """A report past the last step updates the stored rows in place (their last bucket merged
    or a bucket appended), with no recomputation from the points."""
    await start(store)
    await store.append(trial_stream(21), reports(21, 1, range(1, 100)))
    await project(store, page=500)
    await store.execute("UPDATE tr_metrics SET metrics = '{}'::jsonb WHERE trial_id = 21")
    # The points are gone for a recomputation; appending must not need them.
    late = ValidationReported(trial_id=21, run_id=1, steps_completed=100, metrics={"loss": -5.0})
    await store.append(trial_stream(21), [late])
    await project(store, page=500)
    rows = [r for r in await kept(store) if r["group"] == "validation" and r["metric"] == "loss"]
    assert rows and all(r["lasts"][-1] == 100 and r["lows"][-1] == -5.0 for r in rows)
    assert all(len(r["firsts"]) > 1 for r in rows)
