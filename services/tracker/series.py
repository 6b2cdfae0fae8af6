"""Chart series of the tracker's metrics: the buckets it keeps for every trial and the reads
that serve learning curves (every SQL statement of the series path lives here).

A chart bucket groups a series' points by ``steps // width`` and keeps the first and last step
and the lowest and highest value (the API turns each bucket into at most two points). Query
widths are powers of two, so a bucket of width ``w`` nests in exactly one bucket of any width
``W >= w``; the min/max of nested buckets equal the min/max of their points. That makes stored
buckets exact:

- For each (group, metric) series of a trial, ``tr_series_rollups`` holds its buckets at a few
  power-of-two widths fixed by the series' last step (one row per width, the buckets as
  parallel arrays): always what :func:`roll_up` computes from the trial's current points. The
  metric projection keeps them while the trial runs (:func:`keep_buckets`: new points past the
  last step are appended; anything else recomputes the trial), and the trial's end recomputes
  them once more, all in the tracker's transaction.
- A chart of width ``W`` reads each trial's coarsest stored width ``<= W`` and merges its
  buckets, running or ended alike, and buckets the points of trials without any stored row
  (projected before buckets were kept); both give what bucketing every point at ``W`` gives.
  ``W`` is never finer than any series' finest stored width (a series of ``n`` steps stores
  buckets ``n / 1024`` steps wide or finer, so only a chart of more than 1,024 buckets is
  coarser than bucketing the points would allow).

Every rule depends only on the projected rows at that point of the log, so a rebuild from
position 0 writes the same buckets, whatever pages the log is projected in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from events.domain.lifecycle import TERMINAL
from events.log.db import Connection
from events.log.store import read_checkpoint

LEVEL_BUCKETS: tuple[int, ...] = (1024, 256, 64, 16)
"""At most this many buckets per stored width of a series: the finest width bounds how fine a
chart of the trial can be; each coarser one reads four times fewer buckets."""


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

_POINTS_OF_MANY = """
    SELECT m.trial_id AS t, m."group" AS g, k.key AS k, m.steps_completed AS x,
           k.value::float8 AS y
    FROM tr_metrics m, jsonb_each(m.metrics) k
    WHERE m.trial_id = ANY($1::bigint[]) AND NOT m.archived AND jsonb_typeof(k.value) = 'number'
"""
"""The points of :data:`_POINTS` for several trials, each named (``t``)."""


_DEFERRED: ContextVar[set[int] | None] = ContextVar("tracker_deferred_buckets", default=None)
"""The trials whose buckets a rebuild computes once at its end (``None``: keep them live)."""


@contextlib.contextmanager
def deferred_buckets() -> Iterator[set[int]]:
    """Within it, :func:`keep_buckets` and :func:`roll_up` only note the trials they were given,
    and the caller rolls them up with :func:`roll_up_deferred` before its transaction commits.

    For a rebuild, which projects the whole log in one transaction: keeping every trial's
    buckets page by page rewrites them many times (and recomputes each series whenever its
    last step doubles), and rolling a trial up as it ends costs three statements a trial,
    while :func:`roll_up_deferred` at the end stores the same rows for hundreds of trials a
    statement (every rule stores what :func:`roll_up` computes from the points at that time).
    """
    noted: set[int] = set()
    token = _DEFERRED.set(noted)
    try:
        yield noted
    finally:
        _DEFERRED.reset(token)


ROLL_UP_CHUNK = 200
"""Trials rolled up by one statement of :func:`roll_up_deferred`."""


async def roll_up_deferred(conn: Connection, noted: set[int]) -> None:
    """Rolls up the trials :func:`deferred_buckets` noted, :data:`ROLL_UP_CHUNK` at a time: for
    each, what :func:`roll_up` stores."""
    ids = sorted(noted)
    for start in range(0, len(ids), ROLL_UP_CHUNK):
        await _roll_up_many(conn, ids[start : start + ROLL_UP_CHUNK])


async def _roll_up_many(conn: Connection, trial_ids: list[int]) -> None:
    """Replaces the rollups of ``trial_ids`` with buckets of their current points (trials not
    in ``tr_trials`` get none)."""
    await drop_rollups(conn, trial_ids)
    tops = await conn.fetch(
        f"""SELECT p.t, t.experiment_id AS e, p.g, p.k, max(p.x) AS top
            FROM ({_POINTS_OF_MANY}) p JOIN tr_trials t ON t.trial_id = p.t
            GROUP BY p.t, t.experiment_id, p.g, p.k""",
        trial_ids,
    )
    levels = [
        (int(r["t"]), int(r["e"]), str(r["g"]), str(r["k"]), width)
        for r in tops
        for width in level_widths(int(r["top"]))
    ]
    if not levels:
        return
    # Values are finite (the gateway keeps only those), so min/max are plain numbers.
    await conn.execute(
        f"""INSERT INTO tr_series_rollups (trial_id, experiment_id, "group", metric, width,
                                          firsts, lasts, lows, highs)
            SELECT t, e, g, k, w, array_agg(first ORDER BY b), array_agg(last ORDER BY b),
                   array_agg(low ORDER BY b), array_agg(high ORDER BY b)
            FROM (SELECT p.t, l.e, p.g, p.k, l.w, p.x / l.w AS b, min(p.x) AS first,
                         max(p.x) AS last, min(p.y) AS low, max(p.y) AS high
                  FROM ({_POINTS_OF_MANY}) p
                  JOIN unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[])
                       AS l(t, e, g, k, w)
                    ON l.t = p.t AND l.g = p.g AND l.k = p.k
                  GROUP BY p.t, l.e, p.g, p.k, l.w, b) s
            GROUP BY t, e, g, k, w""",
        trial_ids,
        *(list(column) for column in zip(*levels, strict=True)),
    )


async def roll_up(conn: Connection, trial_id: int) -> None:
    """Replaces the rollups of ``trial_id`` with buckets of its current points (the trial has
    ended; call it in the transaction that projects the ending). Within
    :func:`deferred_buckets` it only notes the trial, rolled up at the end."""
    noted = _DEFERRED.get()
    if noted is not None:
        noted.add(trial_id)
        return
    await _roll_up_many(conn, [trial_id])


async def drop_rollups(conn: Connection, trial_ids: Sequence[int]) -> None:
    """Removes the rollups of ``trial_ids`` (their points may change again)."""
    await conn.execute(
        "DELETE FROM tr_series_rollups WHERE trial_id = ANY($1::bigint[])", list(trial_ids)
    )


async def on_trial_state(conn: Connection, trial_id: int, state: str) -> None:
    """Recomputes the buckets of a trial that ends (kept ones already equal them; a trial
    projected before buckets were kept gets them now); other states leave them as they are."""
    if state in TERMINAL:
        await roll_up(conn, trial_id)


# --- buckets kept while trials run (written by the tracker's metric projection) -----------------


@dataclass(frozen=True)
class NewPoint:
    """One point a report just wrote to ``tr_metrics`` (unarchived): what keeping needs of it."""

    trial_id: int
    experiment_id: int
    group: str
    steps: int
    metrics: Mapping[str, Any]


@dataclass
class _Tail:
    """The last bucket of one stored row: how many buckets the row has, and that bucket."""

    count: int
    first: int
    last: int
    low: float
    high: float


def _numeric(metrics: Mapping[str, Any]) -> list[tuple[str, float]]:
    """The values of a report that the rollups' SQL takes (``jsonb_typeof = 'number'``)."""
    # ``+ 0.0`` turns -0.0 into 0.0, as jsonb's numeric does.
    return [
        (k, float(v) + 0.0)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]


def _text(values: Sequence[int] | Sequence[float]) -> str:
    """An array literal PostgreSQL parses back to exactly ``values`` (``repr`` round-trips)."""
    return "{" + ",".join(repr(v) for v in values) + "}"


def _appended(
    tail: _Tail | None, width: int, points: Sequence[tuple[int, float]]
) -> tuple[int, list[list[Any]]]:
    """The buckets of ``width`` after ``points`` (in step order, all past the row's last step):
    how many stored buckets stay, and the buckets that follow them (the first one merges the
    stored last bucket when a point falls into it)."""
    keep = tail.count if tail is not None else 0
    out: list[list[Any]] = []  # [bucket, first, last, low, high]
    for x, y in points:
        b = x // width
        if out and out[-1][0] == b:
            cell = out[-1]
            cell[2], cell[3], cell[4] = x, min(cell[3], y), max(cell[4], y)
        elif not out and tail is not None and tail.last // width == b:
            out.append([b, tail.first, x, min(tail.low, y), max(tail.high, y)])
            keep -= 1
        else:
            out.append([b, x, x, y, y])
    return keep, out


async def keep_buckets(
    conn: Connection, points: Sequence[NewPoint], rebuild: Collection[int] = ()
) -> None:
    """Brings the stored buckets of the trials of ``points`` up to date with those points (just
    written, one per key), so that they equal what :func:`roll_up` would store now.

    A series whose new points all lie past every stored step of their trial's group, at the
    same stored widths, gets them appended (its last bucket merged); anything else recomputes
    the trial from its points with :func:`roll_up`: a trial in ``rebuild`` (a report rolled
    some of its rows back), one with no stored row (new, or projected before buckets were
    kept), a repeated or earlier step, or a series whose widths change as its steps grow
    (each time its last step doubles, so the recomputations cost about twice the points).
    Call it in the transaction that writes the points.
    """
    if not points:
        return
    noted = _DEFERRED.get()
    if noted is not None:  # a rebuild: rolled up once at its end
        noted.update(p.trial_id for p in points)
        return
    full = set(rebuild)
    ids = sorted({p.trial_id for p in points} - full)
    tails: dict[int, dict[tuple[str, str], dict[int, _Tail]]] = {}
    for r in await conn.fetch(
        """SELECT trial_id, "group" AS g, metric AS k, width, cardinality(firsts) AS n,
                  firsts[cardinality(firsts)] AS first, lasts[cardinality(lasts)] AS last,
                  lows[cardinality(lows)] AS low, highs[cardinality(highs)] AS high
           FROM tr_series_rollups WHERE trial_id = ANY($1::bigint[])""",
        ids,
    ):
        stored_series = tails.setdefault(int(r["trial_id"]), {})
        stored_series.setdefault((str(r["g"]), str(r["k"])), {})[int(r["width"])] = _Tail(
            int(r["n"]), int(r["first"]), int(r["last"]), float(r["low"]), float(r["high"])
        )
    full.update(t for t in ids if t not in tails)
    new: dict[int, dict[tuple[str, str], list[tuple[int, float]]]] = {}
    experiments: dict[int, int] = {}
    for p in points:
        if p.trial_id in full:
            continue
        kept = tails[p.trial_id]
        top = max(
            (t.last for (g, _), w in kept.items() if g == p.group for t in w.values()), default=-1
        )
        if p.steps <= top:  # the row may replace one the buckets hold
            full.add(p.trial_id)
            continue
        experiments[p.trial_id] = p.experiment_id
        by_series = new.setdefault(p.trial_id, {})
        for k, y in _numeric(p.metrics):
            by_series.setdefault((p.group, k), []).append((p.steps, y))
    updates: list[tuple[Any, ...]] = []
    inserts: list[tuple[Any, ...]] = []
    for trial_id, by_series in sorted(new.items()):
        if trial_id in full:
            continue
        rows: list[tuple[Any, ...]] = []
        for (g, k), pts in sorted(by_series.items()):
            pts.sort()
            stored = tails[trial_id].get((g, k), {})
            top = max([pts[-1][0], *(t.last for t in stored.values())])
            widths = level_widths(top)
            if stored and sorted(stored) != widths:
                full.add(trial_id)
                break
            for width in widths:
                keep, cells = _appended(stored.get(width), width, pts)
                rows.append((trial_id, g, k, width, keep, bool(stored), cells))
        if trial_id in full:
            continue
        for trial, g, k, width, keep, exists, cells in rows:
            columns = [_text([c[i] for c in cells]) for i in range(1, 5)]
            if exists:
                updates.append((trial, g, k, width, keep, *columns))
            else:
                inserts.append((trial, experiments[trial], g, k, width, *columns))
    if updates:
        await conn.execute(
            """UPDATE tr_series_rollups r
               SET firsts = r.firsts[1:u.keep] || u.firsts::bigint[],
                   lasts = r.lasts[1:u.keep] || u.lasts::bigint[],
                   lows = r.lows[1:u.keep] || u.lows::float8[],
                   highs = r.highs[1:u.keep] || u.highs::float8[]
               FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::int[],
                           $6::text[], $7::text[], $8::text[], $9::text[])
                    AS u(trial_id, g, k, w, keep, firsts, lasts, lows, highs)
               WHERE r.trial_id = u.trial_id AND r."group" = u.g AND r.metric = u.k
                 AND r.width = u.w""",
            *(list(column) for column in zip(*updates, strict=True)),
        )
    if inserts:
        await conn.execute(
            """INSERT INTO tr_series_rollups (trial_id, experiment_id, "group", metric, width,
                                              firsts, lasts, lows, highs)
               SELECT u.trial_id, u.experiment_id, u.g, u.k, u.w, u.firsts::bigint[],
                      u.lasts::bigint[], u.lows::float8[], u.highs::float8[]
               FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::bigint[],
                           $6::text[], $7::text[], $8::text[], $9::text[])
                    AS u(trial_id, experiment_id, g, k, w, firsts, lasts, lows, highs)""",
            *(list(column) for column in zip(*inserts, strict=True)),
        )
    for trial_id in sorted(full):
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
    :func:`experiment_width`): from their stored buckets, and trials without any (projected
    before buckets were kept) from their points."""
    # The few trials read from their points, first: a list the planner sees is an index scan.
    raw = await conn.fetch(
        """SELECT t.trial_id FROM tr_trials t
           WHERE t.experiment_id = $1
             AND NOT EXISTS (SELECT 1 FROM tr_series_rollups r WHERE r.trial_id = t.trial_id)""",
        experiment_id,
    )
    rows = await conn.fetch(
        """(SELECT DISTINCT ON (r.trial_id) r.trial_id, r.width, r.firsts, r.lasts, r.lows,
                   r.highs
            FROM tr_series_rollups r
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
                       WHERE m.trial_id = ANY($5::bigint[])
                         AND m."group" = $2 AND NOT m.archived AND m.metrics ? $3
                         AND jsonb_typeof(m.metrics -> $3) = 'number') p
                 GROUP BY trial_id, b) s
           GROUP BY trial_id
           ORDER BY trial_id""",
        experiment_id,
        group,
        metric,
        width,
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
