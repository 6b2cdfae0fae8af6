"""The query API's view of the tracker's projections (see ``docs/tracking.md``): response
models, and readers that combine the tracker's rows (:mod:`services.tracker.read`, the only
SQL on its tables) with the gateway's own telemetry (heartbeats, progress).

The projections may lag the log by a moment; where the tracker has not created its tables yet
every reader answers as if they were empty. Timestamps leave as ISO 8601 text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Concatenate, ParamSpec

from pydantic import BaseModel, Field

from events.domain import lifecycle
from events.log.db import Connection
from events.log.store import EventStore
from services.api import read as api_read
from services.tracker import read as tracker_read

MAX_LIMIT = 1000
MAX_OFFSET = 2**62

P = ParamSpec("P")


# --- models ---------------------------------------------------------------------------------


class Pagination(BaseModel):
    """Where a page sits in an ordered list."""

    offset: int
    limit: int
    total: int


class PageQuery(BaseModel):
    """``limit`` (1..1000) and ``offset`` of a paginated list."""

    limit: int = Field(100, ge=1, le=MAX_LIMIT)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


class ExperimentSummary(BaseModel):
    """One experiment in a list (``progress``: 1 once COMPLETED, else the mean of its trials'
    progress, or null; searcher-stopped trials never report 1, so the mean alone stops short;
    ``running_trials``: active trials that have started a run)."""

    id: int
    name: str | None
    owner: str
    state: str
    archived: bool
    searcher_name: str | None
    searcher_metric: str | None
    smaller_is_better: bool
    num_trials: int
    running_trials: int
    max_trials: int | None
    best_trial_id: int | None
    best_metric: float | None
    resource_pool: str | None
    submitted_at: str | None
    ended_at: str | None
    progress: float | None
    unmanaged: bool = False
    project_id: int = 1
    project: str = ""
    workspace_id: int = 1
    workspace: str = ""


class TrialSummary(BaseModel):
    """One trial as projected (``tr_trials``)."""

    trial_id: int
    experiment_id: int
    seq: int
    state: str
    hparams: dict[str, Any]
    trial_seed: int
    run_id: int
    restarts: int
    steps_completed: int
    latest_checkpoint: str | None
    best_metric: float | None
    latest_validation: dict[str, Any] | None
    requested_at: str | None
    started_at: str | None
    ended_at: str | None


class Allocation(BaseModel):
    """One run of a trial on its slots (``tr_allocations``)."""

    allocation_id: str
    trial_id: int
    experiment_id: int
    run_id: int
    placements: dict[str, list[str]]
    state: str
    outcome: str | None
    exit_code: int | None
    agent_id: str | None
    allocated_at: str | None
    started_at: str | None
    ended_at: str | None


class Checkpoint(BaseModel):
    """One checkpoint (``tr_checkpoints``); ``validation`` is the trial's validation at the
    same steps, ``searcher_metric`` its searcher metric."""

    uuid: str
    trial_id: int
    experiment_id: int
    run_id: int
    steps_completed: int
    resources: dict[str, Any]
    metadata: dict[str, Any]
    state: str
    reported_at: str | None
    deleted_at: str | None = None
    validation: dict[str, Any] | None
    searcher_metric: float | None


class Slot(BaseModel):
    """One slot of an agent as projected (``tr_slots``)."""

    agent_id: str
    slot_id: str
    device: str
    name: str
    enabled: bool
    draining: bool
    allocation_id: str | None


class Agent(BaseModel):
    """An agent with its slots; ``enabled`` is whether any of its slots is enabled."""

    agent_id: str
    resource_pool: str
    hostname: str
    state: str
    enabled: bool
    registered_at: str | None
    lost_at: str | None = None
    last_heartbeat: str | None
    slots: list[Slot]


# --- rows -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def as_dict(row: Any) -> dict[str, Any]:
    """A row as JSON-able data (timestamps as ISO 8601 text)."""
    return {key: _plain(value) for key, value in dict(row).items()}


# --- the tracker's rows, with the gateway's telemetry beside them ------------------------------


async def read_row(
    store: EventStore,
    reader: Callable[Concatenate[Connection, P], Awaitable[Mapping[str, object] | None]],
    *args: P.args,
    **kwargs: P.kwargs,
) -> dict[str, Any] | None:
    """One row of a tracker read (:mod:`services.tracker.read`) as JSON-able data, or ``None``.

    Args:
        store: the event store (its pool).
        reader: the tracker's read, called with a connection and the rest of the arguments.
        *args: its positional arguments after the connection.
        **kwargs: its keyword arguments.
    """
    async with store.connection() as conn:
        row = await reader(conn, *args, **kwargs)
    return as_dict(row) if row is not None else None


async def read_rows(
    store: EventStore,
    reader: Callable[Concatenate[Connection, P], Awaitable[Sequence[Mapping[str, object]]]],
    *args: P.args,
    **kwargs: P.kwargs,
) -> list[dict[str, Any]]:
    """The rows of a tracker read (:mod:`services.tracker.read`) as JSON-able data.

    Args:
        store: the event store (its pool).
        reader: the tracker's read, called with a connection and the rest of the arguments.
        *args: its positional arguments after the connection.
        **kwargs: its keyword arguments.
    """
    async with store.connection() as conn:
        rows = await reader(conn, *args, **kwargs)
    return [as_dict(r) for r in rows]


async def read_page(
    store: EventStore,
    reader: Callable[
        Concatenate[Connection, P], Awaitable[tuple[Sequence[Mapping[str, object]], int]]
    ],
    *args: P.args,
    **kwargs: P.kwargs,
) -> tuple[list[dict[str, Any]], int]:
    """A page of a paginated tracker read (:mod:`services.tracker.read`) as JSON-able data, and
    the number of rows matching.

    Args:
        store: the event store (its pool).
        reader: the tracker's read, called with a connection and the rest of the arguments.
        *args: its positional arguments after the connection.
        **kwargs: its keyword arguments.
    """
    async with store.connection() as conn:
        rows, total = await reader(conn, *args, **kwargs)
    return [as_dict(r) for r in rows], total


async def experiment_row(store: EventStore, experiment_id: int) -> dict[str, Any] | None:
    """One experiment's summary from the projection, or ``None``."""
    async with store.connection() as conn:
        row = await tracker_read.experiment(conn, experiment_id)
        if row is None:
            return None
        summary = dict(row)
        await _with_progress(conn, [summary])
    return as_dict(summary)


async def with_progress(store: EventStore, summaries: list[dict[str, Any]]) -> None:
    """Sets each experiment summary's ``progress``: 1 once COMPLETED, else the mean progress its
    trials reported (``None`` if none did)."""
    async with store.connection() as conn:
        await _with_progress(conn, summaries)


async def _with_progress(conn: Connection, summaries: list[dict[str, Any]]) -> None:
    """Sets each summary's ``progress`` (see :func:`with_progress`); two queries for the whole
    page."""
    pending = [s["id"] for s in summaries if s["state"] != "COMPLETED"]
    experiment_of = await tracker_read.experiments_of_trials(conn, pending) if pending else {}
    reported = await api_read.progress_of(conn, list(experiment_of)) if experiment_of else {}
    per_experiment: dict[int, list[float]] = {}
    for trial_id, progress in reported.items():
        per_experiment.setdefault(experiment_of[trial_id], []).append(progress)
    for summary in summaries:
        values = per_experiment.get(summary["id"])
        if summary["state"] == "COMPLETED":
            summary["progress"] = 1.0
        else:
            summary["progress"] = sum(values) / len(values) if values else None


async def trial_progress(store: EventStore, trial_id: int) -> float | None:
    """The trial's last reported progress (gateway table ``trial_progress``), or ``None``."""
    async with store.connection() as conn:
        return (await api_read.progress_of(conn, [trial_id])).get(trial_id)


async def list_agents(store: EventStore, agent_id: str | None = None) -> list[dict[str, Any]]:
    """Every agent (or one) with its slots and last heartbeat, by agent id."""
    async with store.connection() as conn:
        rows = await tracker_read.list_agents(conn, agent_id)
        slot_rows = await tracker_read.list_slots(conn, agent_id)
        beats = await api_read.beat_times(conn, [r["agent_id"] for r in rows]) if rows else {}
    slots: dict[str, list[dict[str, Any]]] = {}
    for slot in slot_rows:
        slots.setdefault(slot["agent_id"], []).append(as_dict(slot))
    agents = []
    for row in rows:
        agent = as_dict(row)
        agent["last_heartbeat"] = _plain(beats.get(row["agent_id"]))
        agent["slots"] = slots.get(agent["agent_id"], [])
        agent["enabled"] = any(s["enabled"] for s in agent["slots"])
        agents.append(agent)
    return agents


# --- query helpers --------------------------------------------------------------------------


def check_states(value: str | None) -> str | None:
    """Validates a comma-separated list of lifecycle states (a pydantic field validator body).

    Raises:
        ValueError: an empty list or an unknown state.
    """
    if value is None:
        return None
    states = [s.strip().upper() for s in value.split(",") if s.strip()]
    if not states:
        raise ValueError("must name at least one state")
    unknown = sorted(set(states) - lifecycle.STATES)
    if unknown:
        raise ValueError(f"unknown state(s) {unknown}; known: {sorted(lifecycle.STATES)}")
    return ",".join(states)


def states_of(value: str | None) -> list[str] | None:
    """The states of a validated comma list (``None``: no filter)."""
    return value.split(",") if value else None


def pagination(query: PageQuery, total: int) -> dict[str, int]:
    """The ``pagination`` object of a list response."""
    return {"offset": query.offset, "limit": query.limit, "total": total}
