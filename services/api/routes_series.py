"""Chart data for the web UI: downsampled metric series of an experiment's trials (one metric)
and of one trial (every metric), and an experiment's logs across its trials.

Series are read from the tracker's ``tr_metrics`` and downsampled in the database (the lowest and
highest value of each bucket of steps, :mod:`services.api.downsample`), so a 1,000-trial
experiment answers with about a hundred points per trial. Each answer carries
``position``: the tracker's checkpoint when the read began; the projection holds at least the
events up to it, so a client that follows ``/api/v1/events/stream`` after that position misses
no point (it may see a few twice, which it recognises by their steps).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from events.store import EventStore
from services.api import projections_read as pr
from services.api import tables
from services.api.access import readable_experiment, readable_trial
from services.api.downsample import append_points, bucket_count, bucket_points, bucket_width
from services.api.errors import bad_request, parse
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import MAX_ID, trial_id_of
from services.tracker.projections import NAME as TRACKER

routes = RouteTable("charts")

MAX_NAME = 200


class ExperimentSeriesQuery(BaseModel):
    """Which metric of which group, and about how many buckets of steps (the server lowers it
    for experiments with many trials)."""

    metric: str | None = Field(
        None, min_length=1, max_length=MAX_NAME, description="default: the searcher metric"
    )
    group: str = Field("validation", min_length=1, max_length=MAX_NAME)
    buckets: int = Field(300, ge=1, le=10_000)


class Series(BaseModel):
    """One downsampled series: parallel columns of steps and values, in step order."""

    steps: list[int]
    values: list[float]


class TrialSeries(Series):
    """One trial's series of the requested metric."""

    trial_id: int


class ExperimentSeriesResponse(BaseModel):
    """Every trial's series of one metric, the metric names seen, and the log position the
    data reflects at least."""

    experiment_id: int
    group: str
    metric: str
    buckets: int
    position: int
    metrics: dict[str, list[str]]
    trials: list[TrialSeries]


class TrialSeriesQuery(BaseModel):
    """About how many buckets of steps each series gets."""

    buckets: int = Field(500, ge=1, le=10_000)


class NamedSeries(Series):
    """One metric of one group of a trial."""

    group: str
    metric: str


class TrialSeriesResponse(BaseModel):
    """Every metric of every group of one trial, downsampled."""

    trial_id: int
    buckets: int
    position: int
    series: list[NamedSeries]


class ExperimentLogsQuery(BaseModel):
    """Log lines of an experiment's trials after ``after_id``, or its last ``tail`` lines."""

    after_id: int = Field(0, ge=0, le=2**62)
    limit: int = Field(1000, ge=1, le=10_000)
    tail: int | None = Field(None, ge=1, le=10_000)


class ExperimentLogEntry(BaseModel):
    """One line of a trial's output."""

    id: int
    trial_id: int
    allocation_id: str
    rank: int | None
    stream: str
    ts: str
    line: str


class ExperimentLogsResponse(BaseModel):
    """A page of log lines in id order."""

    logs: list[ExperimentLogEntry]
    next_after_id: int


class PositionResponse(BaseModel):
    """The log position the projections reflect at least."""

    position: int


@routes.get("/api/v1/projections/position", allow=USERS, response=PositionResponse)
async def projections_position(request: web.Request) -> web.Response:
    """Where to start following ``/api/v1/events/stream`` after reading the projections."""
    return web.json_response({"position": await tracker_position(store_of(request))})


def _experiment_id(request: web.Request) -> int:
    raw = request.match_info["experiment_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_ID:
        raise bad_request("experiment_id: must be a positive integer", "experiment_id")
    return int(raw)


async def tracker_position(store: EventStore) -> int:
    """The tracker's checkpoint: the projections reflect the log at least up to it."""
    value = await tables.fetchval(
        store, "SELECT position FROM checkpoints WHERE name = $1", TRACKER
    )
    return int(value or 0)


async def _metric_names(store: EventStore, experiment_id: int) -> dict[str, list[str]]:
    """Metric names by group, from the first trials' reports and every trial's last validation
    (reading every row of a large experiment for its names would cost more than its chart)."""
    rows = await pr.fetch(
        store,
        """SELECT DISTINCT g, k FROM (
               SELECT m."group" AS g, jsonb_object_keys(m.metrics) AS k FROM tr_metrics m
               WHERE m.trial_id IN (SELECT trial_id FROM tr_trials WHERE experiment_id = $1
                                    ORDER BY seq LIMIT 3)
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


def _add_bucket(series: Series, row: Any) -> None:
    """Appends one bucket row (``first``, ``last``, ``low``, ``high``) to ``series``."""
    previous = series.values[-1] if series.values else None
    points = bucket_points(
        int(row["first"]), int(row["last"]), float(row["low"]), float(row["high"]), previous
    )
    append_points(series.steps, series.values, points)


@routes.get(
    "/api/v1/experiments/{experiment_id}/series",
    allow=USERS,
    query=ExperimentSeriesQuery,
    response=ExperimentSeriesResponse,
)
async def experiment_series(request: web.Request) -> web.Response:
    """One metric of every trial of an experiment, downsampled to the lowest and highest value
    per bucket of steps, for learning curves."""
    query = parse(ExperimentSeriesQuery, dict(request.query))
    view = await readable_experiment(request, _experiment_id(request))
    store = store_of(request)
    position = await tracker_position(store)
    metric = query.metric or view.searcher.get("metric")
    if not isinstance(metric, str) or not metric:
        raise bad_request("metric: name a metric (the experiment has no searcher metric)", "metric")
    trials = await pr.count(
        store, "SELECT count(*) FROM tr_trials WHERE experiment_id = $1", view.experiment_id
    )
    buckets = bucket_count(query.buckets, trials)
    # The trials' steps bound their reports' steps (cheap: one row per trial); reading the
    # metric rows for their largest step would cost as much as the chart itself.
    top = await pr.fetchrow(
        store,
        "SELECT max(steps_completed) AS top FROM tr_trials WHERE experiment_id = $1",
        view.experiment_id,
    )
    if top is None or not top["top"]:
        top = await pr.fetchrow(
            store,
            """SELECT max(steps_completed) AS top FROM tr_metrics
               WHERE experiment_id = $1 AND "group" = $2""",
            view.experiment_id,
            query.group,
        )
    width = bucket_width(int(top["top"] or 0) if top is not None else 0, buckets)
    rows = await pr.fetch(
        store,
        # Metric values in the log are always finite numbers (the gateway keeps only those).
        """SELECT trial_id, x / $4 AS b, min(x) AS first, max(x) AS last,
                  min(y) AS low, max(y) AS high
           FROM (SELECT trial_id, steps_completed AS x, (metrics -> $3)::float8 AS y
                 FROM tr_metrics
                 WHERE experiment_id = $1 AND "group" = $2 AND NOT archived
                   AND metrics ? $3) p
           GROUP BY trial_id, b ORDER BY trial_id, b""",
        view.experiment_id,
        query.group,
        metric,
        width,
    )
    series: dict[int, TrialSeries] = {}
    for row in rows:
        trial_id = int(row["trial_id"])
        entry = series.get(trial_id)
        if entry is None:
            entry = series[trial_id] = TrialSeries(trial_id=trial_id, steps=[], values=[])
        _add_bucket(entry, row)
    body = {
        "experiment_id": view.experiment_id,
        "group": query.group,
        "metric": metric,
        "buckets": buckets,
        "position": position,
        "metrics": await _metric_names(store, view.experiment_id),
        "trials": [s.model_dump() for s in series.values()],
    }
    return web.json_response(body)


@routes.get(
    "/api/v1/trials/{trial_id}/series",
    allow=USERS,
    query=TrialSeriesQuery,
    response=TrialSeriesResponse,
)
async def trial_series(request: web.Request) -> web.Response:
    """Every metric of every group of one trial, downsampled per bucket of steps."""
    query = parse(TrialSeriesQuery, dict(request.query))
    trial_id = trial_id_of(request.match_info["trial_id"])
    await readable_trial(request, trial_id)
    store = store_of(request)
    position = await tracker_position(store)
    top = await pr.fetchrow(
        store, "SELECT max(steps_completed) AS top FROM tr_metrics WHERE trial_id = $1", trial_id
    )
    buckets = bucket_count(query.buckets, 1)
    width = bucket_width(int(top["top"] or 0) if top is not None else 0, buckets)
    rows = await pr.fetch(
        store,
        """SELECT g, k, x / $2 AS b, min(x) AS first, max(x) AS last,
                  min(y) AS low, max(y) AS high
           FROM (SELECT t."group" AS g, m.key AS k, t.steps_completed AS x,
                        m.value::float8 AS y
                 FROM tr_metrics t, jsonb_each(t.metrics) m
                 WHERE t.trial_id = $1 AND NOT t.archived
                   AND jsonb_typeof(m.value) = 'number') p
           GROUP BY g, k, b ORDER BY g, k, b""",
        trial_id,
        width,
    )
    series: dict[tuple[str, str], NamedSeries] = {}
    for row in rows:
        key = (str(row["g"]), str(row["k"]))
        entry = series.get(key)
        if entry is None:
            entry = series[key] = NamedSeries(group=key[0], metric=key[1], steps=[], values=[])
        _add_bucket(entry, row)
    body = {
        "trial_id": trial_id,
        "buckets": buckets,
        "position": position,
        "series": [s.model_dump() for s in series.values()],
    }
    return web.json_response(body)


@routes.get(
    "/api/v1/experiments/{experiment_id}/logs",
    allow=USERS,
    query=ExperimentLogsQuery,
    response=ExperimentLogsResponse,
)
async def experiment_logs(request: web.Request) -> web.Response:
    """Log lines of every trial of an experiment, in the order they were stored."""
    query = parse(ExperimentLogsQuery, dict(request.query))
    view = await readable_experiment(request, _experiment_id(request))
    tail = query.tail is not None
    rows = await pr.fetch(
        store_of(request),
        f"""SELECT id, trial_id, allocation_id, rank, stream, ts, line FROM task_logs
            WHERE trial_id IN (SELECT trial_id FROM tr_trials WHERE experiment_id = $1)
              AND id > $2
            ORDER BY id {"DESC" if tail else "ASC"} LIMIT $3""",
        view.experiment_id,
        query.after_id,
        query.tail if query.tail is not None else query.limit,
    )
    entries = [
        {
            "id": r["id"],
            "trial_id": r["trial_id"],
            "allocation_id": r["allocation_id"],
            "rank": r["rank"],
            "stream": r["stream"],
            "ts": r["ts"].isoformat(),
            "line": r["line"],
        }
        for r in rows
    ]
    if tail:
        entries.reverse()
    next_after = entries[-1]["id"] if entries else query.after_id
    return web.json_response({"logs": entries, "next_after_id": next_after})
