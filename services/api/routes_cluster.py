"""The cluster as the web UI shows it: the queue of waiting trials and slot use over time.

Agents and slots are shared by design (``docs/tracking.md``); the queue shows every waiting
trial with its priority and position, but names another user's trial and experiment only to
admins. The job queue (``GET /api/v1/job-queues``) adds tasks and the jobs that hold slots, in
the scheduler's order (:func:`events.domain.aggregates.jobs.job_queue`), under the same rule.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates import CLUSTER_TYPES, fold_cluster, iso
from events.domain.aggregates.jobs import job_queue
from events.domain.aggregates.slurm import SLURM_FACTS, SlurmAllocations
from events.domain.config.experiment_settings import DEFAULT_PRIORITY
from services.api import projections_read as pr
from services.api.auth import Principal, principal_of
from services.api.errors import parse
from services.api.routing import USERS, RouteTable, store_of
from services.tracker import read as tracker_read

routes = RouteTable("cluster")

"""The priority of an experiment whose config names none (lower runs first)."""


class QueueEntry(BaseModel):
    """A trial waiting for slots; ``trial_id``/``experiment_id``/``name`` are ``null`` on
    another user's entry unless the caller is an admin."""

    position: int
    trial_id: int | None
    experiment_id: int | None
    name: str | None
    owner: str
    priority: int
    slots: int
    resource_pool: str
    requested_at: str | None


class QueueResponse(BaseModel):
    """The waiting trials, first to be placed first."""

    queue: list[QueueEntry]


class JobsQuery(BaseModel):
    """Only the jobs of one resource pool (``default`` names the default pool)."""

    resource_pool: str | None = Field(None, max_length=200)


class SlurmJobEntry(BaseModel):
    """The latest Slurm job of a job of a Slurm pool, as ``squeue`` last showed it (``reason``:
    why it waits, e.g. ``Resources``, ``Priority``)."""

    job_id: str
    state: str
    reason: str


class JobEntry(BaseModel):
    """A trial or task that holds slots or waits for them; ``job_id``/``experiment_id``/``name``
    are ``null`` on another user's job unless the caller is an admin."""

    position: int
    kind: str
    job_id: str | None
    experiment_id: int | None
    name: str | None
    owner: str
    state: str
    priority: int
    slots: int
    resource_pool: str
    submitted_at: str | None
    slurm: SlurmJobEntry | None = None


class JobsResponse(BaseModel):
    """The jobs holding slots (in placement order), then the waiting ones (first placed first)."""

    jobs: list[JobEntry]


class Holder(BaseModel):
    """A live allocation and what it runs; ``trial_id``/``experiment_id`` are ``null`` on
    another user's allocation unless the caller is an admin."""

    allocation_id: str
    trial_id: int | None
    experiment_id: int | None
    owner: str
    state: str
    agent_id: str | None


class HoldersResponse(BaseModel):
    """The allocations that hold slots now."""

    allocations: list[Holder]


class UtilisationQuery(BaseModel):
    """The window to report, in minutes back from now."""

    minutes: int = Field(60, ge=1, le=24 * 60)


class UtilisationResponse(BaseModel):
    """Busy slots per minute over the window, beside the slots the cluster has now."""

    total_slots: int
    minutes: list[str]
    busy: list[float]


def _int(value: Any, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


@routes.get("/api/v1/cluster/queue", allow=USERS, response=QueueResponse)
async def queue(request: web.Request) -> web.Response:
    """Trials of active experiments that hold no slots, in the order of their priority (lower
    first) and request time."""
    principal = principal_of(request)
    rows = await pr.read_rows(store_of(request), tracker_read.waiting_trials)
    entries = []
    for row in rows:
        entries.append(
            {
                **_owner_only(principal, row, ("trial_id", "experiment_id", "name")),
                "owner": row["owner"],
                "priority": _int(row["priority"], DEFAULT_PRIORITY),
                "slots": _int(row["slots"], 1),
                "resource_pool": row["resource_pool"] or "default",
                "requested_at": row["requested_at"],
            }
        )
    entries.sort(key=lambda e: e["priority"])  # stable: request order within a priority
    for i, entry in enumerate(entries, start=1):
        entry["position"] = i
    return web.json_response({"queue": entries})


@routes.get("/api/v1/job-queues", allow=USERS, query=JobsQuery, response=JobsResponse)
async def job_queues(request: web.Request) -> web.Response:
    """Every trial and task that holds slots or waits for them, in the scheduler's order,
    folded from the log (``resource_pool``: only that pool's)."""
    query = parse(JobsQuery, dict(request.query))
    principal = principal_of(request)
    cluster = fold_cluster(await store_of(request).read_types(CLUSTER_TYPES))
    slurm = SlurmAllocations()
    for recorded in await store_of(request).read_types(SLURM_FACTS):
        slurm.apply(recorded)
    entries: list[dict[str, Any]] = []
    for job in job_queue(cluster):
        pool = job.resource_pool or "default"
        if query.resource_pool is not None and pool != query.resource_pool:
            continue
        row = {
            "job_id": job.job_id,
            "experiment_id": job.experiment_id,
            "name": job.name,
            "owner": job.owner,
        }
        entries.append(
            {
                "position": len(entries) + 1,
                "kind": job.kind,
                **_owner_only(principal, row, ("job_id", "experiment_id", "name")),
                "owner": job.owner,
                "state": job.state,
                "priority": job.priority,
                "slots": job.slots,
                "resource_pool": pool,
                "submitted_at": iso(job.submitted_at),
                "slurm": _slurm_job(slurm, job.allocation_id),
            }
        )
    return web.json_response({"jobs": entries})


def _slurm_job(slurm: SlurmAllocations, allocation_id: str) -> dict[str, str] | None:
    alloc = slurm.allocations.get(allocation_id)
    job = alloc.job if alloc is not None else None
    if job is None:
        return None
    return {"job_id": job.job_id, "state": job.state, "reason": job.reason}


@routes.get("/api/v1/cluster/allocations", allow=USERS, response=HoldersResponse)
async def holders(request: web.Request) -> web.Response:
    """The allocations not yet terminated: which trial holds the slots of each."""
    principal = principal_of(request)
    rows = await pr.read_rows(store_of(request), tracker_read.live_allocations)
    out = []
    for row in rows:
        out.append(
            {
                "allocation_id": row["allocation_id"],
                **_owner_only(principal, row, ("trial_id", "experiment_id")),
                "owner": row["owner"],
                "state": row["state"],
                "agent_id": row["agent_id"],
            }
        )
    return web.json_response({"allocations": out})


def _owner_only(principal: Principal, row: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The row's ``keys`` as the caller may see them: as they are for an admin or the row's
    owner, ``None`` for anyone else."""
    mine = principal.is_admin or row["owner"] == principal.name
    return {key: row[key] if mine else None for key in keys}


def busy_per_minute(
    allocations: list[tuple[datetime, datetime, int]], start: datetime, minutes: int
) -> list[float]:
    """Mean busy slots in each minute from ``start``, from ``(from, to, slots)`` intervals."""
    busy = [0.0] * minutes
    for begin, end, slots in allocations:
        for i in range(minutes):
            lo = start + timedelta(minutes=i)
            hi = lo + timedelta(minutes=1)
            overlap = (min(end, hi) - max(begin, lo)).total_seconds()
            if overlap > 0:
                busy[i] += slots * overlap / 60.0
    return [round(b, 3) for b in busy]


@routes.get(
    "/api/v1/cluster/utilisation", allow=USERS, query=UtilisationQuery, response=UtilisationResponse
)
async def utilisation(request: web.Request) -> web.Response:
    """Mean busy slots per minute over the last ``minutes`` minutes, from the allocations."""
    query = parse(UtilisationQuery, dict(request.query))
    store = store_of(request)
    now = datetime.now(UTC)
    start = (now - timedelta(minutes=query.minutes)).replace(second=0, microsecond=0)
    async with store.connection() as conn:
        rows = await tracker_read.allocation_spans(conn, start)
        total = await tracker_read.enabled_slots(conn)
    spans = []
    for row in rows:
        placements = row["placements"] if isinstance(row["placements"], dict) else {}
        slots = sum(len(v) for v in placements.values() if isinstance(v, list))
        spans.append((row["since"], row["ended_at"] or now, slots))
    minutes = query.minutes + 1
    return web.json_response(
        {
            "total_slots": total,
            "minutes": [(start + timedelta(minutes=i)).isoformat() for i in range(minutes)],
            "busy": busy_per_minute(spans, start, minutes),
        }
    )
