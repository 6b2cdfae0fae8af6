"""What a running trial asks about its search: the experiment's best validation so far, and its
searcher operation (the legacy ``ctx.searcher.operations()`` protocol).

Both answers are read from the log, not from projections, so a validation the trial reported a
moment ago already counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from events.domain import lifecycle
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import TrialStopRequested, ValidationReported
from services.api.access import readable_trial, searcher_readable_experiment
from services.api.errors import not_found
from services.api.routing import ANYONE, RouteTable, store_of
from services.api.views import (
    MAX_ID,
    load_trial_control,
    read_facts,
    trial_id_of,
)

routes = RouteTable("searcher")


class BestValidationResponse(BaseModel):
    """The best value of the searcher metric reported by any trial of the experiment (``null``
    before the first), and which trial reported it."""

    metric: float | None
    trial_id: int | None
    searcher_metric: str
    smaller_is_better: bool


class SearcherOperationResponse(BaseModel):
    """The trial's operation: train until ``length`` (in ``unit``), then validate. ``completed``:
    there is none (the searcher stopped the trial, or it or its experiment has ended)."""

    completed: bool
    length: int | None
    unit: str | None


def _experiment_id(request: web.Request) -> int:
    raw = request.match_info["experiment_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_ID:
        raise not_found(f"no experiment {raw!r}")
    return int(raw)


def searcher_length(config: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """Every trial's searcher length and its unit: ``max_time`` in ``time_metric``, else the
    legacy ``max_length`` (a bare number counts batches); ``(None, None)`` when neither is set."""
    searcher = config.get("searcher")
    if not isinstance(searcher, Mapping):
        return None, None
    max_time = searcher.get("max_time")
    if isinstance(max_time, int) and not isinstance(max_time, bool):
        return max_time, str(searcher.get("time_metric") or "") or None
    length = searcher.get("max_length")
    unit = "batches"
    if isinstance(length, Mapping):  # stored configs list every unit, the unused ones null
        given = [(k, v) for k, v in length.items() if v is not None]
        unit, length = given[0] if len(given) == 1 else ("", None)
    if isinstance(length, int) and not isinstance(length, bool):
        return length, str(unit)
    return None, None


@routes.get(
    "/api/v1/experiments/{experiment_id}/searcher/best_searcher_validation_metric",
    allow=ANYONE,
    response=BestValidationResponse,
)
async def best_validation(request: web.Request) -> web.Response:
    """The experiment's best searcher metric so far, by its ``smaller_is_better`` (its owner, an
    admin, the agent, or a trial token of one of its trials)."""
    view = await searcher_readable_experiment(request, _experiment_id(request), with_trials=True)
    metric = str(view.searcher.get("metric") or "")
    streams = [trial_stream(trial_id) for trial_id in view.trials]
    validations = await store_of(request).read_streams(streams, ["ValidationReported"])
    sign = 1.0 if view.smaller_is_better else -1.0
    best: tuple[float, int] | None = None
    for recorded in validations:
        event = recorded.decode()
        assert isinstance(event, ValidationReported)
        value = event.metrics.get(metric)
        if value is None or not math.isfinite(value):
            continue
        if best is None or sign * value < sign * best[0]:
            best = (value, event.trial_id)
    return web.json_response(
        {
            "metric": best[0] if best else None,
            "trial_id": best[1] if best else None,
            "searcher_metric": metric,
            "smaller_is_better": view.smaller_is_better,
        }
    )


@routes.get(
    "/api/v1/trials/{trial_id}/searcher/operation",
    allow=ANYONE,
    response=SearcherOperationResponse,
)
async def searcher_operation(request: web.Request) -> web.Response:
    """The trial's searcher operation: its searcher length, or ``completed`` once the searcher
    asked it to stop or it or its experiment has ended."""
    trial_id = trial_id_of(request.match_info["trial_id"])
    view = await readable_trial(request, trial_id)
    store = store_of(request)
    length, unit = searcher_length(view.config)
    stops, _ = await read_facts(
        store, experiment_stream(view.experiment_id), ("TrialStopRequested",)
    )
    stopped = any(
        isinstance(event, TrialStopRequested) and event.trial_id == trial_id
        for event in (recorded.decode() for recorded in stops)
    )
    control = await load_trial_control(store, trial_id)
    completed = stopped or control.terminal or view.state in lifecycle.ENDED or length is None
    return web.json_response(
        {"completed": completed, "length": None if completed else length, "unit": unit}
    )
