"""Trials for users: describe one, read (or follow) its logs, kill it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain import lifecycle
from events.domain.authorization import Permission
from events.domain.deciders.trial import KillTrial, decide_kill
from events.domain.names import trial_stream
from events.domain.types import TrialAlerted
from events.log.envelope import RecordedEvent
from events.log.errors import StoreUnavailableError
from events.log.store import EventStore, Transaction
from services.api import history, tables
from services.api import projections_read as pr
from services.api.access import check_experiment, readable_trial
from services.api.auth import principal_of
from services.api.decided import append_accepted
from services.api.errors import parse, read_json
from services.api.inbox import in_transaction
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import (
    ExperimentView,
    experiment_of,
    load_experiment,
    load_trial_control,
    read_facts,
    trial_id_of,
)
from services.tracker import read as tracker_read

log = structlog.get_logger("api")
routes = RouteTable("trials")

MAX_LOG_LINES = 10_000
FOLLOW_POLL_SECONDS = 0.5
"""How often a followed log polls ``task_logs`` (and the trial's state) for more."""


MAX_ALERTS_SHOWN = 100


class TrialAlert(BaseModel):
    """An alert the training code raised (event ``TrialAlerted``)."""

    run_id: int
    title: str
    description: str
    level: str
    recorded_at: str


class TrialDetail(pr.TrialSummary):
    """A trial with its allocations, its checkpoints, its last reported progress and status,
    and its latest alerts (at most 100, oldest first)."""

    allocations: list[pr.Allocation]
    checkpoints: list[pr.Checkpoint]
    progress: float | None
    status: str | None
    alerts: list[TrialAlert]
    at: int | None = Field(None, description="the log position of a past state (``?at=``)")


class LogsQuery(BaseModel):
    """Which log lines: after ``after_id``, at most ``limit`` (or the last ``tail``); with
    ``follow`` the answer streams NDJSON until the trial has ended and its logs are drained."""

    after_id: int = Field(0, ge=0, le=2**62)
    limit: int = Field(1000, ge=1, le=MAX_LOG_LINES)
    follow: bool = False
    tail: int | None = Field(None, ge=1, le=MAX_LOG_LINES)


class LogEntry(BaseModel):
    """One stored line of a trial process's output."""

    id: int
    allocation_id: str
    rank: int | None
    stream: str
    ts: str
    line: str


class LogsResponse(BaseModel):
    """A page of log lines; ``done``: the trial has ended and there is nothing after these."""

    logs: list[LogEntry]
    next_after_id: int
    done: bool


class KillBody(BaseModel):
    """No fields."""


class KillResponse(BaseModel):
    """The trial's state now, and whether a kill was newly requested."""

    trial_id: int
    state: str
    changed: bool


async def _visible_trial(request: web.Request) -> tuple[int, ExperimentView]:
    """The trial id of the path and its experiment; 404 unknown, 403 another user's."""
    trial_id = trial_id_of(request.match_info["trial_id"])
    return trial_id, await readable_trial(request, trial_id)


@routes.get("/api/v1/trials/{trial_id}", allow=USERS, query=history.AtQuery, response=TrialDetail)
async def get_trial(request: web.Request) -> web.Response:
    """A trial from the projection with its allocations, checkpoints and progress."""
    trial_id, view = await _visible_trial(request)
    store = store_of(request)
    at = await history.position_at(store, request)
    if at is not None:
        past = await load_experiment(store, view.experiment_id, trial_id=trial_id, at=at)
        past_body = await history.trial_detail(store, past, trial_id, at)
        alerts, _ = await read_facts(store, trial_stream(trial_id), ("TrialAlerted",), at=at)
        past_body["alerts"] = [_alert(recorded) for recorded in alerts[-MAX_ALERTS_SHOWN:]]
        return web.json_response(past_body)
    body = await pr.read_row(store, tracker_read.trial, trial_id)
    if body is None:
        control = await load_trial_control(store, trial_id)
        body = view.requested_trial(trial_id, control.state)
    body["allocations"] = await pr.read_rows(store, tracker_read.allocations_of, trial_id)
    body["checkpoints"], _ = await pr.read_page(
        store, tracker_read.list_checkpoints, trial_id=trial_id
    )
    body["progress"] = await pr.trial_progress(store, trial_id)
    body["status"] = await tables.fetchval(
        store, "SELECT status FROM trial_status WHERE trial_id = $1", trial_id
    )
    alerts, _ = await read_facts(store, trial_stream(trial_id), ("TrialAlerted",))
    body["alerts"] = [_alert(recorded) for recorded in alerts[-MAX_ALERTS_SHOWN:]]
    return web.json_response(body)


def _alert(recorded: RecordedEvent) -> dict[str, Any]:
    event = recorded.decode()
    assert isinstance(event, TrialAlerted)
    return {
        "run_id": event.run_id,
        "title": event.title,
        "description": event.description,
        "level": event.level,
        "recorded_at": recorded.recorded_at.isoformat(),
    }


# --- logs -----------------------------------------------------------------------------------


def _log_entry(row: Any) -> dict[str, Any]:
    return {
        "id": row["id"],
        "allocation_id": row["allocation_id"],
        "rank": row["rank"],
        "stream": row["stream"],
        "ts": row["ts"].isoformat(),
        "line": row["line"],
    }


async def _read_logs(
    store: EventStore, trial_id: int, after_id: int, limit: int, *, tail: bool = False
) -> list[dict[str, Any]]:
    """Lines after ``after_id`` in id order: the first ``limit``, or with ``tail`` the last."""
    rows = await tables.fetch(
        store,
        f"""SELECT id, allocation_id, rank, stream, ts, line FROM task_logs
            WHERE trial_id = $1 AND id > $2 ORDER BY id {"DESC" if tail else "ASC"} LIMIT $3""",
        trial_id,
        after_id,
        limit,
    )
    entries = [_log_entry(r) for r in rows]
    return entries[::-1] if tail else entries


async def _trial_finished(store: EventStore, trial_id: int) -> bool:
    """Whether the trial has ended (its own state, or its experiment's having ended)."""
    control = await load_trial_control(store, trial_id)
    if control.terminal:
        return True
    view = await load_experiment(store, await experiment_of(store, trial_id), with_trials=False)
    return view.state in lifecycle.ENDED


@routes.get("/api/v1/trials/{trial_id}/logs", allow=USERS, query=LogsQuery, response=LogsResponse)
async def trial_logs(request: web.Request) -> web.StreamResponse:
    """A trial's log lines (table ``task_logs``); ``follow=true`` streams them as NDJSON until
    the trial has ended and every line is sent."""
    query = parse(LogsQuery, dict(request.query))
    trial_id, _ = await _visible_trial(request)
    store = store_of(request)
    if query.follow:
        return await _follow(request, store, trial_id, query)
    finished = await _trial_finished(store, trial_id)
    if query.tail is not None:
        entries = await _read_logs(store, trial_id, query.after_id, query.tail, tail=True)
    else:
        entries = await _read_logs(store, trial_id, query.after_id, query.limit)
    next_after_id = entries[-1]["id"] if entries else query.after_id
    done = finished and not await _read_logs(store, trial_id, next_after_id, 1)
    return web.json_response({"logs": entries, "next_after_id": next_after_id, "done": done})


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _follow(
    request: web.Request, store: EventStore, trial_id: int, query: LogsQuery
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    cursor = query.after_id
    first = True
    try:
        while not _gone(request):
            finished = await _trial_finished(store, trial_id)
            if first and query.tail is not None:
                entries = await _read_logs(store, trial_id, cursor, query.tail, tail=True)
            else:
                entries = await _read_logs(store, trial_id, cursor, query.limit)
            first = False
            if entries:
                cursor = entries[-1]["id"]
                await response.write(
                    "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries).encode()
                )
                continue
            if finished:
                await response.write_eof()
                break
            await asyncio.sleep(FOLLOW_POLL_SECONDS)
    except ConnectionResetError:
        log.debug("log follower left", trial_id=trial_id)
    except StoreUnavailableError as exc:
        log.warning("log follow stopped: store unavailable", trial_id=trial_id, error=str(exc))
        if request.transport is not None:
            request.transport.close()
    return response


# --- kill -----------------------------------------------------------------------------------


@routes.post("/api/v1/trials/{trial_id}/kill", allow=USERS, body=KillBody, response=KillResponse)
async def kill_trial(request: web.Request) -> web.Response:
    """Appends TrialKillRequested; the scheduler kills the trial's run and ends it CANCELED
    (owner or admin; 409 when the trial has ended)."""
    principal = principal_of(request)
    trial_id = trial_id_of(request.match_info["trial_id"])
    parse(KillBody, await read_json(request))
    experiment_id = await experiment_of(store_of(request), trial_id)
    command = KillTrial(trial_id=trial_id, actor=principal.name)

    async def work(tx: Transaction) -> dict[str, Any]:
        view = await load_experiment(tx, experiment_id, trial_id=trial_id)
        await check_experiment(tx, principal, view, Permission.UPDATE_EXPERIMENT)
        control = await load_trial_control(tx, trial_id)
        events = await append_accepted(
            tx,
            trial_stream(trial_id),
            decide_kill(view, control, command),
            expected_version=control.version,
            actor=principal.name,
        )
        return {"trial_id": trial_id, "state": control.state, "changed": bool(events)}

    result = await in_transaction(store_of(request), work)
    if result["changed"]:
        log.info("trial kill requested", trial_id=trial_id, actor=principal.name)
    return web.json_response(result)
