"""Chart series of the tracker's metrics: the rollups of ended trials and the reads that serve
learning curves (every SQL statement of the series path lives here).

A chart bucket groups a series' points by ``steps // width`` and keeps the first and last step
and the lowest and highest value (the API turns each bucket into at most two points). Query
widths are powers of two, so a bucket of width ``w`` nests in exactly one bucket of any width
``W >= w``; the min/max of nested buckets equal the min/max of their points. That makes a
precomputed rollup exact:

- When a trial ends (its terminal ``TrialStateChanged``), :func:`roll_up` stores, for each of its
  (group, metric) series, the buckets at a few power-of-two widths (``tr_series_rollups``, one
  row per width with the buckets as parallel arrays), in the tracker's transaction.
- A chart of width ``W`` reads each ended trial's coarsest stored width ``<= W`` and merges its
  buckets, and buckets the points of live trials (few at a time) and of ended trials without
  rollups (projected before they existed); both give what bucketing every point at ``W`` gives.
  ``W`` is never finer than an ended series' finest stored width.
- A trial that leaves its terminal state (a continued experiment) loses its rollups, and a report
  for a trial that is still terminal recomputes them (:func:`roll_up_reported`), so no chart is
  ever drawn from stale buckets.

Every rule depends only on the projected rows at that point of the log, so a rebuild from
position 0 writes the same rollups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from events.domain.lifecycle import TERMINAL
from events.log.db import Connection
from events.log.store import read_checkpoint

LEVEL_BUCKETS: tuple[int, ...] = (1024, 256, 64, 16)
"""At most this many buckets per stored width of a series: the finest width bounds how fine a
chart of an ended trial can be; each coarser one reads four times fewer buckets."""

_TERMINAL = sorted(TERMINAL)


@dataclass(frozen=True)
class SeriesBuckets:
    """The buckets of one series in step order, as parallel columns: each bucket's first and
    last step and its lowest and highest value."""

    trial_id: int
    group: str
    metric: str
    firsts: list[int]
    lasts: list[int]
    lows: list[float]
    highs: list[float]


def power_width(max_steps: int, buckets: int) -> int:
    """The smallest power of two such that ``buckets`` buckets of it cover steps ``0..max_steps``."""
    needed = -(-(max(0, max_steps) + 1) // max(1, buckets))
    return 1 << max(0, needed - 1).bit_length()


def level_widths(max_steps: int) -> list[int]:
    """The widths stored for a series whose last step is ``max_steps`` (distinct, finest first)."""
    return sorted({power_width(max_steps, b) for b in LEVEL_BUCKETS})


# --- the rollups (written by the tracker's projections) -----------------------------------------

# A trial's unarchived numeric points by (group, metric): what its rollups and its own chart
# bucket (the experiment chart's live branch selects the same points of one metric).
_POINTS = """
    SELECT m."group" AS g, k.key AS k, m.steps_completed AS x, k.value::float8 AS y
    FROM tr_metrics m, jsonb_each(m.metrics) k
    WHERE m.trial_id = $1 AND NOT m.archived AND jsonb_typeof(k.value) = 'number'
"""


async def roll_up(conn: Connection, trial_id: int) -> None:
    """Replaces the rollups of ``trial_id`` with buckets of its current points (the trial has
    ended; call it in the transaction that projects the ending)."""
    await drop_rollups(conn, [trial_id])
    experiment_id = await conn.fetchval(
        "SELECT experiment_id FROM tr_trials WHERE trial_id = $1", trial_id
    )
    if experiment_id is None:
        return
    tops = await conn.fetch(
        f"SELECT g, k, max(x) AS top FROM ({_POINTS}) p GROUP BY g, k", trial_id
    )
    levels = [
        (str(r["g"]), str(r["k"]), width) for r in tops for width in level_widths(int(r["top"]))
    ]
    if not levels:
        return
    # Values are finite (the gateway keeps only those), so min/max are plain numbers.
    await conn.execute(
        f"""INSERT INTO tr_series_rollups (trial_id, experiment_id, "group", metric, width,
                                          firsts, lasts, lows, highs)
            SELECT $1, $2, g, k, w, array_agg(first ORDER BY b), array_agg(last ORDER BY b),
                   array_agg(low ORDER BY b), array_agg(high ORDER BY b)
            FROM (SELECT p.g, p.k, l.w, p.x / l.w AS b, min(p.x) AS first, max(p.x) AS last,
                         min(p.y) AS low, max(p.y) AS high
                  FROM ({_POINTS}) p
                  JOIN unnest($3::text[], $4::text[], $5::bigint[]) AS l(g, k, w)
                    ON l.g = p.g AND l.k = p.k
                  GROUP BY p.g, p.k, l.w, b) s
            GROUP BY g, k, w""",
        trial_id,
        int(experiment_id),
        [g for g, _, _ in levels],
        [k for _, k, _ in levels],
        [w for _, _, w in levels],
    )


async def drop_rollups(conn: Connection, trial_ids: Sequence[int]) -> None:
    """Removes the rollups of ``trial_ids`` (their points may change again)."""
    await conn.execute(
        "DELETE FROM tr_series_rollups WHERE trial_id = ANY($1::bigint[])", list(trial_ids)
    )


async def on_trial_state(conn: Connection, trial_id: int, state: str) -> None:
    """Keeps the rollups in step with a projected trial state: built when the trial ends,
    dropped when it runs again."""
    if state in TERMINAL:
        await roll_up(conn, trial_id)
    else:
        await drop_rollups(conn, [trial_id])


async def roll_up_reported(conn: Connection, trial_ids: Sequence[int]) -> None:
    """Recomputes the rollups of ``trial_ids``: ended trials whose points a report just changed
    (after their rollups were built)."""
    for trial_id in sorted(set(trial_ids)):
        await roll_up(conn, trial_id)


# --- reads (the API's series routes) ------------------------------------------------------------


async def position(conn: Connection, consumer: str) -> int:
    """The checkpoint of ``consumer``: its projections reflect the log at least up to it."""
    return await read_checkpoint(conn, consumer)


async def trial_count(conn: Connection, experiment_id: int) -> int:
    """How many trials an experiment has."""
    value = await conn.fetchval(
        "SELECT count(*) FROM tr_trials WHERE experiment_id = $1", experiment_id
    )
    return int(value or 0)


async def trial_ids(conn: Connection, experiment_id: int) -> list[int]:
    """The ids of an experiment's trials."""
    rows = await conn.fetch(
        "SELECT trial_id FROM tr_trials WHERE experiment_id = $1 ORDER BY trial_id", experiment_id
    )
    return [int(r["trial_id"]) for r in rows]


async def metric_names(conn: Connection, experiment_id: int) -> dict[str, list[str]]:
    """Metric names by group, from the first trials' reports, the ended trials' rollups and
    every trial's last validation (reading every row of a large experiment for its names would
    cost more than its chart)."""
    rows = await conn.fetch(
        """SELECT DISTINCT g, k FROM (
               SELECT m."group" AS g, jsonb_object_keys(m.metrics) AS k FROM tr_metrics m
               WHERE m.trial_id IN (SELECT trial_id FROM tr_trials WHERE experiment_id = $1
                                    ORDER BY seq LIMIT 3)
               UNION ALL
               SELECT r."group", r.metric FROM tr_series_rollups r WHERE r.experiment_id = $1
               UNION ALL
               SELECT 'validation', jsonb_object_keys(t.latest_validation -> 'metrics')
               FROM tr_trials t
               WHERE t.experiment_id = $1
                 AND jsonb_typeof(t.latest_validation -> 'metrics') = 'object'
           ) s ORDER BY g, k""",
        experiment_id,
    )
    names: dict[str, list[str]] = {}
    for row in rows:
        names.setdefault(str(row["g"]), []).append(str(row["k"]))
    return names


async def experiment_width(
    conn: Connection, experiment_id: int, group: str, metric: str, buckets: int
) -> int:
    """The power-of-two bucket width of an experiment's chart of about ``buckets`` buckets: wide
    enough for its largest step (the trials' steps bound their reports' steps, so one row per
    trial is read, not the points), and no finer than any ended series' finest rollup."""
    top = await conn.fetchval(
        "SELECT max(steps_completed) FROM tr_trials WHERE experiment_id = $1", experiment_id
    )
    if not top:
        top = await conn.fetchval(
            """SELECT max(steps_completed) FROM tr_metrics
               WHERE experiment_id = $1 AND "group" = $2""",
            experiment_id,
            group,
        )
    finest = await conn.fetchval(
        """SELECT max(w) FROM (SELECT min(width) AS w FROM tr_series_rollups
                               WHERE experiment_id = $1 AND "group" = $2 AND metric = $3
                               GROUP BY trial_id) s""",
        experiment_id,
        group,
        metric,
    )
    return max(power_width(int(top or 0), buckets), int(finest or 1))


async def experiment_series(
    conn: Connection, experiment_id: int, group: str, metric: str, width: int
) -> list[SeriesBuckets]:
    """Every trial's series of one metric in buckets of ``width`` steps (a power of two, at least
    :func:`experiment_width`): ended trials from their rollups, live ones (and ended ones without
    any rollup: projected before rollups existed) from their points."""
    # The few trials read from their points, first: a list the planner sees is an index scan.
    raw = await conn.fetch(
        """SELECT t.trial_id FROM tr_trials t
           WHERE t.experiment_id = $1
             AND (NOT (t.state = ANY($2::text[]))
                  OR NOT EXISTS (SELECT 1 FROM tr_series_rollups r WHERE r.trial_id = t.trial_id))""",
        experiment_id,
        _TERMINAL,
    )
    rows = await conn.fetch(
        """(SELECT DISTINCT ON (r.trial_id) r.trial_id, r.width, r.firsts, r.lasts, r.lows,
                   r.highs
            FROM tr_series_rollups r
            JOIN tr_trials t ON t.trial_id = r.trial_id AND t.state = ANY($5::text[])
            WHERE r.experiment_id = $1 AND r."group" = $2 AND r.metric = $3 AND r.width <= $4
            ORDER BY r.trial_id, r.width DESC)
           UNION ALL
           SELECT trial_id, $4, array_agg(first ORDER BY b), array_agg(last ORDER BY b),
                  array_agg(low ORDER BY b), array_agg(high ORDER BY b)
           FROM (SELECT trial_id, x / $4 AS b, min(x) AS first, max(x) AS last, min(y) AS low,
                        max(y) AS high
                 FROM (SELECT m.trial_id, m.steps_completed AS x,
                              (m.metrics -> $3)::float8 AS y
                       FROM tr_metrics m
                       WHERE m.trial_id = ANY($6::bigint[])
                         AND m."group" = $2 AND NOT m.archived AND m.metrics ? $3
                         AND jsonb_typeof(m.metrics -> $3) = 'number') p
                 GROUP BY trial_id, b) s
           GROUP BY trial_id
           ORDER BY trial_id""",
        experiment_id,
        group,
        metric,
        width,
        _TERMINAL,
        [int(r["trial_id"]) for r in raw],
    )
    return [_merged(r, group, metric, width) for r in rows]


def _merged(row: Any, group: str, metric: str, width: int) -> SeriesBuckets:
    """A row of buckets ``row["width"]`` steps wide merged into buckets of ``width`` (a multiple
    of it: the nested buckets' first, last, lowest and highest)."""
    firsts: list[int] = row["firsts"]
    lasts: list[int] = row["lasts"]
    lows: list[float] = row["lows"]
    highs: list[float] = row["highs"]
    out = SeriesBuckets(int(row["trial_id"]), group, metric, [], [], [], [])
    if int(row["width"]) == width:
        out.firsts.extend(firsts)
        out.lasts.extend(lasts)
        out.lows.extend(lows)
        out.highs.extend(highs)
        return out
    current = -1
    for first, last, low, high in zip(firsts, lasts, lows, highs, strict=True):
        bucket = first // width
        if bucket != current:
            current = bucket
            out.firsts.append(first)
            out.lasts.append(last)
            out.lows.append(low)
            out.highs.append(high)
        else:
            out.lasts[-1] = last
            out.lows[-1] = min(out.lows[-1], low)
            out.highs[-1] = max(out.highs[-1], high)
    return out


async def raw_experiment_series(
    conn: Connection, experiment_id: int, group: str, metric: str, width: int
) -> list[SeriesBuckets]:
    """The same as :func:`experiment_series` computed from every trial's points (no rollups):
    the reference the rollups must equal."""
    rows = await conn.fetch(
        """SELECT trial_id, x / $4 AS b, min(x) AS first, max(x) AS last,
                  min(y) AS low, max(y) AS high
           FROM (SELECT trial_id, steps_completed AS x, (metrics -> $3)::float8 AS y
                 FROM tr_metrics
                 WHERE experiment_id = $1 AND "group" = $2 AND NOT archived
                   AND metrics ? $3 AND jsonb_typeof(metrics -> $3) = 'number') p
           GROUP BY trial_id, b ORDER BY trial_id, b""",
        experiment_id,
        group,
        metric,
        width,
    )
    return _series(rows, lambda r: (int(r["trial_id"]), group, metric))


async def trial_series(conn: Connection, trial_id: int, buckets: int) -> list[SeriesBuckets]:
    """Every (group, metric) series of one trial in about ``buckets`` buckets (from its points:
    one trial's points are few)."""
    top = await conn.fetchval(
        "SELECT max(steps_completed) FROM tr_metrics WHERE trial_id = $1", trial_id
    )
    width = power_width(int(top or 0), buckets)
    rows = await conn.fetch(
        f"""SELECT g, k, x / $2 AS b, min(x) AS first, max(x) AS last,
                   min(y) AS low, max(y) AS high
            FROM ({_POINTS}) p
            GROUP BY g, k, b ORDER BY g, k, b""",
        trial_id,
        width,
    )
    return _series(rows, lambda r: (trial_id, str(r["g"]), str(r["k"])))


def _series(
    rows: Sequence[Any], key_of: Callable[[Any], tuple[int, str, str]]
) -> list[SeriesBuckets]:
    """Bucket rows (ordered by series, then bucket) grouped into series."""
    out: list[SeriesBuckets] = []
    for row in rows:
        trial_id, group, metric = key_of(row)
        last = out[-1] if out else None
        if last is None or (last.trial_id, last.group, last.metric) != (trial_id, group, metric):
            last = SeriesBuckets(trial_id, group, metric, [], [], [], [])
            out.append(last)
        last.firsts.append(int(row["first"]))
        last.lasts.append(int(row["last"]))
        last.lows.append(float(row["low"]))
        last.highs.append(float(row["high"]))
    return out
