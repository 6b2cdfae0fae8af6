"""Time travel: experiments, trials and the cluster as they were at a past point of the log.

A request names the point with ``?at=``: a log position (an integer) or an ISO 8601 timestamp,
which stands for the last position recorded at or before it. The answer is the fold
(:mod:`events.domain.aggregates`) of the relevant streams' events up to that position, in the same
shape as the present state; what only the tracker's projections know and the log does not
(heartbeats, reported progress and status) is null in a past answer.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates import (
    CLUSTER_FACTS,
    TRIAL_SUMMARY_FACTS,
    ExperimentView,
    fold_cluster,
    fold_trial,
    fold_trial_summary,
    iso,
    metric_value,
)
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import CheckpointSaved, CheckpointsDeleted, ValidationReported
from events.log.envelope import RecordedEvent
from events.log.store import EventStore
from services.api.errors import bad_request, not_found
from services.api.views import MAX_ID, read_facts

AT = "at"
"""The query parameter naming the point in the log."""

MAX_AT_CHARS = 64
AT_DESCRIPTION = "a log position or ISO 8601 timestamp: the state as it was then"


class AtQuery(BaseModel):
    """``at``: a log position or an ISO 8601 timestamp; the answer is the state as it was then."""

    at: str | None = Field(None, description=AT_DESCRIPTION)


async def position_at(store: EventStore, request: web.Request) -> int | None:
    """The log position ``?at=`` names (``None``: no ``at``, the present).

    Raises:
        ApiError: 400 naming ``at`` when it is neither a position nor a timestamp.
    """
    raw = request.query.get(AT)
    if raw is None:
        return None
    text = raw.strip()
    if text.isascii() and text.isdigit() and len(text) <= 19 and int(text) <= MAX_ID:
        return int(text)
    moment = _timestamp(text)
    if moment is None:
        shown = raw[:MAX_AT_CHARS]
        raise bad_request(
            f"at must be a log position (an integer >= 0) or an ISO 8601 timestamp"
            f" such as 2026-01-01T12:00:00Z; got {shown!r}",
            AT,
        )
    return await store.position_at(moment)


def _timestamp(text: str) -> datetime | None:
    if not text or len(text) > MAX_AT_CHARS or not text.isascii() or not text[:1].isdigit():
        return None
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
        return moment.astimezone(UTC) if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    except (ValueError, OverflowError):  # not a timestamp, or one beyond year 1..9999 in UTC
        return None


async def _trial_events(store: EventStore, trial_id: int, at: int) -> list[RecordedEvent]:
    events, _ = await read_facts(store, trial_stream(trial_id), TRIAL_SUMMARY_FACTS, at=at)
    return events


async def trial_summaries(store: EventStore, view: ExperimentView, at: int) -> list[dict[str, Any]]:
    """Each trial ``view`` had requested, as it was at position ``at``, in request order."""
    return [
        fold_trial_summary(view, trial_id, await _trial_events(store, trial_id, at))
        for trial_id in view.trials
    ]


def best_of(view: ExperimentView, trials: list[dict[str, Any]]) -> tuple[int | None, float | None]:
    """The best trial and its best metric among ``trials`` (the earliest of equals)."""
    best: tuple[int | None, float | None] = (None, None)
    for trial in trials:
        value = trial["best_metric"]
        if value is None:
            continue
        current = best[1]
        if current is None or (value < current if view.smaller_is_better else value > current):
            best = (trial["trial_id"], value)
    return best


def experiment_detail(
    view: ExperimentView, trials: list[dict[str, Any]], at: int
) -> dict[str, Any]:
    """``GET /api/v1/experiments/{id}?at=``: the experiment and its trials at position ``at``."""
    body = view.describe()
    searcher = view.searcher
    best_trial_id, best_metric = best_of(view, trials)
    body.update(
        {
            "searcher_name": str(searcher.get("name") or ""),
            "max_trials": searcher.get("max_trials"),
            "best_trial_id": best_trial_id,
            "best_metric": best_metric,
            "resource_pool": str(view.resources.get("resource_pool") or "default"),
            "progress": None,
            "trials": trials,
            "at": at,
        }
    )
    return body


def trial_page(
    view: ExperimentView,
    trials: list[dict[str, Any]],
    *,
    states: list[str] | None,
    best_first: bool,
    limit: int,
    offset: int,
) -> tuple[list[dict[str, Any]], int]:
    """A page of ``trials`` filtered and ordered as the projection's list is, and the count."""
    rows = [t for t in trials if states is None or t["state"] in states]
    rows.sort(key=lambda t: t["seq"])
    if best_first:
        sign = 1.0 if view.smaller_is_better else -1.0
        rows.sort(key=lambda t: (t["best_metric"] is None, sign * (t["best_metric"] or 0.0)))
    return rows[offset : offset + limit], len(rows)


async def trial_detail(
    store: EventStore, view: ExperimentView, trial_id: int, at: int
) -> dict[str, Any]:
    """``GET /api/v1/trials/{id}?at=``: the trial, its allocations and its checkpoints at
    position ``at``; ``view`` is its experiment folded up to ``at`` (404 if not yet requested)."""
    if trial_id not in view.trials:
        raise not_found(f"no trial {trial_id} at position {at}")
    events = await _trial_events(store, trial_id, at)
    body = fold_trial_summary(view, trial_id, events)
    trial = fold_trial(trial_id, events)
    body["allocations"] = [
        {
            "allocation_id": a.allocation_id,
            "trial_id": trial_id,
            "experiment_id": view.experiment_id,
            "run_id": a.run_id,
            "placements": a.placements,
            "state": a.state,
            "outcome": a.outcome,
            "exit_code": a.exit_code,
            "agent_id": a.agent_id,
            "allocated_at": iso(a.allocated_at),
            "started_at": iso(a.started_at),
            "ended_at": iso(a.ended_at),
        }
        for a in sorted(trial.allocations.values(), key=lambda a: a.run_id)
    ]
    deleted = await _deleted_checkpoints(store, view.experiment_id, at)
    body["checkpoints"] = _checkpoints(view, events, deleted)
    body["progress"] = None
    body["status"] = None
    body["at"] = at
    return body


async def _deleted_checkpoints(
    store: EventStore, experiment_id: int, at: int
) -> dict[str, datetime]:
    deletions, _ = await read_facts(
        store, experiment_stream(experiment_id), ("CheckpointsDeleted",), at=at
    )
    out: dict[str, datetime] = {}
    for recorded in deletions:
        event = recorded.decode()
        assert isinstance(event, CheckpointsDeleted)
        for uuid in event.uuids:
            out.setdefault(uuid, recorded.recorded_at)
    return out


def _checkpoints(
    view: ExperimentView, events: list[RecordedEvent], deleted: dict[str, datetime]
) -> list[dict[str, Any]]:
    """The trial's checkpoints, each with the latest validation at its steps (by run)."""
    metric = view.searcher.get("metric")
    validations: dict[int, ValidationReported] = {}
    saved: list[tuple[CheckpointSaved, datetime]] = []
    for recorded in events:
        event = (
            recorded.decode()
            if recorded.type in ("CheckpointSaved", "ValidationReported")
            else None
        )
        if isinstance(event, ValidationReported):
            known = validations.get(event.steps_completed)
            if known is None or event.run_id >= known.run_id:
                validations[event.steps_completed] = event
        elif isinstance(event, CheckpointSaved):
            saved.append((event, recorded.recorded_at))
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for event, at in saved:
        if event.uuid in seen:
            continue
        seen.add(event.uuid)
        validation = validations.get(event.steps_completed)
        doc = (
            None
            if validation is None
            else {
                "run_id": validation.run_id,
                "steps_completed": validation.steps_completed,
                "metrics": dict(validation.metrics),
            }
        )
        out.append(
            {
                "uuid": event.uuid,
                "trial_id": event.trial_id,
                "experiment_id": view.experiment_id,
                "run_id": event.run_id,
                "steps_completed": event.steps_completed,
                "resources": dict(event.resources),
                "metadata": dict(event.metadata),
                "state": "DELETED" if event.uuid in deleted else "COMPLETED",
                "reported_at": iso(at),
                "deleted_at": iso(deleted.get(event.uuid)),
                "validation": doc,
                "searcher_metric": None
                if validation is None
                else metric_value(validation.metrics, metric if isinstance(metric, str) else None),
            }
        )
    out.sort(key=lambda c: (c["steps_completed"], c["uuid"]))
    return out


async def agents_at(
    store: EventStore, at: int, agent_id: str | None = None
) -> list[dict[str, Any]]:
    """Every agent (or one) as ``GET /api/v1/agents`` lists them, as they were at ``at``."""
    cluster = fold_cluster(await store.read_types(CLUSTER_FACTS, upto=at))
    agents = cluster.agent_list()
    return [a for a in agents if agent_id is None or a["agent_id"] == agent_id]
