"""Chart data for the web UI: downsampled metric series of an experiment's trials (one metric)
and of one trial (every metric), and an experiment's logs across its trials.

The tracker reads the series (through :mod:`services.tracker.read`; their SQL is in
:mod:`services.tracker.series`): buckets of steps with the lowest and highest value of each, from
the buckets it keeps for every trial, running or ended, so a 1,000-trial experiment
answers with about a hundred points per trial without reading its million points.
:mod:`services.api.downsample` sizes the buckets and turns each into at most two points. Each answer carries ``position``: the tracker's checkpoint when
the read began; the projection holds at least the events up to it, so a client that follows
``/api/v1/events/stream`` after that position misses no point (it may see a few twice, which it
recognises by their steps).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, Field

from events.log.errors import StatementError
from events.log.store import EventStore
from services.api import tables
from services.api.access import readable_experiment, readable_trial
from services.api.downsample import append_points, bucket_count, bucket_points
from services.api.errors import bad_request, parse
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import MAX_ID, trial_id_of
from services.tracker import read as tracker_read

routes = RouteTable("charts")
T = TypeVar("T")

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
    return await _read(store, tracker_read.projections_position) or 0


async def _read(store: EventStore, read: Callable[..., Awaitable[T]], *args: Any) -> T | None:
    """Runs a tracker read on a pooled connection; ``None`` when the tracker has not created its
    tables yet."""
    try:
        async with store.connection() as conn:
            return await read(conn, *args)
    except StatementError as exc:
        if exc.undefined_table:
            return None
        raise


def _points(found: tracker_read.SeriesBuckets) -> dict[str, list[Any]]:
    """A series' buckets as parallel columns of steps and values (at most two per bucket)."""
    steps: list[int] = []
    values: list[float] = []
    for first, last, low, high in zip(
        found.firsts, found.lasts, found.lows, found.highs, strict=True
    ):
        previous = values[-1] if values else None
        append_points(steps, values, bucket_points(first, last, low, high, previous))
    return {"steps": steps, "values": values}


def _json(body: dict[str, Any]) -> web.Response:
    """A JSON response encoded by orjson (a chart carries up to a few hundred thousand numbers)."""
    return web.Response(body=orjson.dumps(body), content_type="application/json")


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
    experiment_id = view.experiment_id
    trials = await _read(store, tracker_read.series_trial_count, experiment_id) or 0
    buckets = bucket_count(query.buckets, trials)
    width = (
        await _read(
            store, tracker_read.experiment_series_width, experiment_id, query.group, metric, buckets
        )
        or 1
    )
    found = (
        await _read(
            store, tracker_read.experiment_series, experiment_id, query.group, metric, width
        )
        or []
    )
    body = {
        "experiment_id": experiment_id,
        "group": query.group,
        "metric": metric,
        "buckets": buckets,
        "position": position,
        "metrics": await _read(store, tracker_read.series_metric_names, experiment_id) or {},
        "trials": [{"trial_id": s.trial_id, **_points(s)} for s in found],
    }
    return _json(body)


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
    buckets = bucket_count(query.buckets, 1)
    found = await _read(store, tracker_read.trial_series, trial_id, buckets) or []
    body = {
        "trial_id": trial_id,
        "buckets": buckets,
        "position": position,
        "series": [{"group": s.group, "metric": s.metric, **_points(s)} for s in found],
    }
    return _json(body)


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
    store = store_of(request)
    trial_ids = await _read(store, tracker_read.series_trial_ids, view.experiment_id) or []
    rows = await tables.fetch(
        store,
        f"""SELECT id, trial_id, allocation_id, rank, stream, ts, line FROM task_logs
            WHERE trial_id = ANY($1::bigint[]) AND id > $2
            ORDER BY id {"DESC" if tail else "ASC"} LIMIT $3""",
        trial_ids,
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
