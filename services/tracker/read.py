"""What other services may read of the tracker's tables: typed rows, one query each.

The tracker owns every ``tr_*`` and ``audit_*`` table (``schema.OWNED_TABLES``) and is the only
package whose modules hold SQL naming them; the gateway's query API and web pages read them
through this module only (the chart series and usage reads at its end delegate to the modules that
keep those paths' SQL together). Each takes a connection outside a transaction and answers as if the
tables were empty while they do not exist yet (a database migrated only by services that
started before the tracker, under a superuser). Rows keep database types (``datetime``, decoded
JSON); presenting them is the reader's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal, TypedDict, cast

from events.log.db import Connection
from events.log.errors import StatementError
from services.tracker import projections, series, usage

CheckpointState = Literal["COMPLETED", "DELETED", "all"]


class ExperimentRow(TypedDict):
    """One experiment of ``tr_experiments`` (``running_trials``: active trials that started)."""

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
    submitted_at: datetime | None
    ended_at: datetime | None
    unmanaged: bool


class TrialRow(TypedDict):
    """One trial of ``tr_trials``."""

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
    requested_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None


class AllocationRow(TypedDict):
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
    allocated_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None


class CheckpointRow(TypedDict):
    """One checkpoint of ``tr_checkpoints``."""

    uuid: str
    trial_id: int
    experiment_id: int
    run_id: int
    steps_completed: int
    resources: dict[str, Any]
    metadata: dict[str, Any]
    state: str
    reported_at: datetime | None
    deleted_at: datetime | None
    validation: dict[str, Any] | None
    searcher_metric: float | None


class SlotRow(TypedDict):
    """One slot of an agent (``tr_slots``)."""

    agent_id: str
    slot_id: str
    device: str
    name: str
    enabled: bool
    draining: bool
    allocation_id: str | None


class AgentRow(TypedDict):
    """One agent of ``tr_agents``."""

    agent_id: str
    resource_pool: str
    hostname: str
    state: str
    registered_at: datetime | None
    lost_at: datetime | None


class WaitingTrialRow(TypedDict):
    """An active trial of an active experiment holding no allocation, with what the queue
    shows of its experiment (``priority``/``slots`` as the config gave them, unparsed)."""

    trial_id: int
    experiment_id: int
    name: str | None
    owner: str
    resource_pool: str | None
    priority: str | None
    slots: str | None
    requested_at: datetime | None


class LiveAllocationRow(TypedDict):
    """An allocation not yet terminated and the owner of its experiment."""

    allocation_id: str
    trial_id: int
    experiment_id: int
    state: str
    agent_id: str | None
    owner: str


class AllocationSpanRow(TypedDict):
    """When an allocation held its slots (``ended_at`` None: still holds them)."""

    since: datetime
    ended_at: datetime | None
    placements: dict[str, list[str]] | Any


class AuditRow(TypedDict):
    """One row of ``audit_trail``."""

    position: int
    recorded_at: datetime
    type: str
    stream_id: str
    actor: str | None
    request_id: str | None
    remote: str | None
    experiment_id: int | None
    trial_id: int | None
    detail: Any


class MetricRow(TypedDict):
    """One reported point of ``tr_metrics``."""

    run_id: int
    group: str
    steps_completed: int
    metrics: dict[str, Any]
    archived: bool
    reported_at: datetime


async def _rows(conn: Connection, sql: str, *args: Any) -> list[dict[str, Any]]:
    """The rows of a query as dicts; none while the tracker has not created its tables."""
    try:
        return [dict(r) for r in await conn.fetch(sql, *args)]
    except StatementError as exc:
        if exc.undefined_table:
            return []
        raise


async def _count(conn: Connection, sql: str, *args: Any) -> int:
    rows = await _rows(conn, sql, *args)
    return int(next(iter(rows[0].values()))) if rows else 0


class _Where:
    """A conjunction of SQL conditions with numbered parameters."""

    def __init__(self) -> None:
        self.conditions: list[str] = []
        self.args: list[Any] = []

    def add(self, condition: str, *values: Any) -> None:
        """Adds ``condition``, where ``{}`` placeholders become the next parameter numbers."""
        numbers = []
        for value in values:
            self.args.append(value)
            numbers.append(f"${len(self.args)}")
        self.conditions.append(condition.format(*numbers))

    def sql(self) -> str:
        """``WHERE ...`` (or nothing)."""
        return "WHERE " + " AND ".join(self.conditions) if self.conditions else ""

    async def page(
        self, conn: Connection, columns: str, table: str, order: str, limit: int | None, offset: int
    ) -> tuple[list[dict[str, Any]], int]:
        """The matching rows of ``table`` in ``order``, one page of them, and how many match."""
        total = await _count(conn, f"SELECT count(*) FROM {table} {self.sql()}", *self.args)
        lim, off = f"${len(self.args) + 1}", f"${len(self.args) + 2}"
        rows = await _rows(
            conn,
            f"SELECT {columns} FROM {table} {self.sql()} ORDER BY {order} LIMIT {lim} OFFSET {off}",
            *self.args,
            limit,
            offset,
        )
        return rows, total


# --- experiments ----------------------------------------------------------------------------

_EXPERIMENT_COLUMNS = """
    e.experiment_id AS id, e.name, e.owner, e.state, e.archived, e.searcher_name,
    e.searcher_metric, e.smaller_is_better, e.num_trials, e.max_trials, e.best_trial_id,
    e.best_metric, e.resource_pool, e.submitted_at, e.ended_at, e.unmanaged,
    (SELECT count(*) FROM tr_trials t WHERE t.experiment_id = e.experiment_id
       AND t.state = 'ACTIVE' AND t.started_at IS NOT NULL)::int AS running_trials"""


async def list_experiments(
    conn: Connection,
    *,
    states: Sequence[str] | None,
    owner: str | None,
    archived: bool | None,
    name: str | None,
    descending: bool,
    limit: int,
    offset: int,
) -> tuple[list[ExperimentRow], int]:
    """A page of experiments matching the filters, by id, and how many match.

    Args:
        conn: a connection (not in a transaction).
        states: keep these states only (``None``: all).
        owner: keep this owner's only.
        archived: keep archived (``True``) or unarchived (``False``) ones; ``None``: both.
        name: keep names containing this text (case-insensitive).
        descending: newest first.
        limit: page size.
        offset: rows skipped.
    """
    where = _Where()
    if states is not None:
        where.add("e.state = ANY({}::text[])", list(states))
    if owner is not None:
        where.add("e.owner = {}", owner)
    if archived is not None:
        where.add("e.archived = {}", archived)
    if name is not None:
        where.add("strpos(lower(coalesce(e.name, '')), lower({})) > 0", name)
    order = f"e.experiment_id {'DESC' if descending else 'ASC'}"
    rows, total = await where.page(
        conn, _EXPERIMENT_COLUMNS, "tr_experiments e", order, limit, offset
    )
    return cast(list[ExperimentRow], rows), total


async def experiment(conn: Connection, experiment_id: int) -> ExperimentRow | None:
    """One experiment, or ``None``."""
    rows = await _rows(
        conn,
        f"SELECT {_EXPERIMENT_COLUMNS} FROM tr_experiments e WHERE e.experiment_id = $1",
        experiment_id,
    )
    return cast(ExperimentRow, rows[0]) if rows else None


async def experiments_of_trials(conn: Connection, experiment_ids: Sequence[int]) -> dict[int, int]:
    """Trial id -> experiment id, for every trial of these experiments."""
    rows = await _rows(
        conn,
        "SELECT trial_id, experiment_id FROM tr_trials WHERE experiment_id = ANY($1::bigint[])",
        list(experiment_ids),
    )
    return {int(r["trial_id"]): int(r["experiment_id"]) for r in rows}


# --- trials ---------------------------------------------------------------------------------

_TRIAL_COLUMNS = """
    trial_id, experiment_id, seq, state, hparams, trial_seed, run_id, restarts, steps_completed,
    latest_checkpoint, best_metric, latest_validation, requested_at, started_at, ended_at"""


async def list_trials(
    conn: Connection,
    experiment_id: int,
    *,
    states: Sequence[str] | None = None,
    best_first: bool = False,
    smaller_is_better: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[TrialRow], int]:
    """A page of an experiment's trials (by sequence, or best metric first) and their count."""
    where = _Where()
    where.add("experiment_id = {}", experiment_id)
    if states is not None:
        where.add("state = ANY({}::text[])", list(states))
    direction = "ASC" if smaller_is_better else "DESC"
    order = f"best_metric {direction} NULLS LAST, seq" if best_first else "seq"
    rows, total = await where.page(conn, _TRIAL_COLUMNS, "tr_trials", order, limit, offset)
    return cast(list[TrialRow], rows), total


async def trial(conn: Connection, trial_id: int) -> TrialRow | None:
    """One trial, or ``None``."""
    rows = await _rows(
        conn, f"SELECT {_TRIAL_COLUMNS} FROM tr_trials WHERE trial_id = $1", trial_id
    )
    return cast(TrialRow, rows[0]) if rows else None


async def allocations_of(conn: Connection, trial_id: int) -> list[AllocationRow]:
    """A trial's allocations by run."""
    rows = await _rows(
        conn,
        """SELECT allocation_id, trial_id, experiment_id, run_id, placements, state, outcome,
                  exit_code, agent_id, allocated_at, started_at, ended_at
           FROM tr_allocations WHERE trial_id = $1 ORDER BY run_id""",
        trial_id,
    )
    return cast(list[AllocationRow], rows)


async def trial_metrics(
    conn: Connection,
    trial_id: int,
    *,
    group: str | None,
    archived: bool,
    max_points: int | None,
) -> list[MetricRow]:
    """A trial's reported metrics (one group, or all), by group, steps and run.

    Args:
        conn: a connection (not in a transaction).
        trial_id: the trial.
        group: keep this group only (``None``: every group).
        archived: keep points of archived runs too.
        max_points: keep at most this many evenly spaced points of each (group, run) series,
            its first and last included (``None``: all).
    """
    # Row i (0-based, by steps) of a series of n > m points is kept iff some k in 0..m-1 has
    # floor(k * (n - 1) / (m - 1)) = i: m evenly spaced points, the first and the last included.
    rows = await _rows(
        conn,
        """WITH s AS (
               SELECT run_id, "group", steps_completed, metrics, archived, reported_at,
                      row_number() OVER w - 1 AS i,
                      count(*) OVER (PARTITION BY "group", run_id) AS n
               FROM tr_metrics
               WHERE trial_id = $1 AND ($2::text IS NULL OR "group" = $2)
                 AND ($3 OR NOT archived)
               WINDOW w AS (PARTITION BY "group", run_id ORDER BY steps_completed))
           SELECT run_id, "group", steps_completed, metrics, archived, reported_at FROM s
           WHERE $4::bigint IS NULL OR n <= $4
              OR ($4 = 1 AND i = n - 1)
              OR ($4 > 1 AND ((i * ($4 - 1) + n - 2) / (n - 1)) * (n - 1) < (i + 1) * ($4 - 1))
           ORDER BY "group", steps_completed, run_id""",
        trial_id,
        group,
        archived,
        max_points,
    )
    return cast(list[MetricRow], rows)


# --- checkpoints ----------------------------------------------------------------------------

_CHECKPOINT_COLUMNS = """
    uuid, trial_id, experiment_id, run_id, steps_completed, resources, metadata, state,
    reported_at, deleted_at, validation, searcher_metric"""


async def list_checkpoints(
    conn: Connection,
    *,
    experiment_id: int | None = None,
    trial_id: int | None = None,
    state: CheckpointState = "all",
    by_metric: bool = False,
    smaller_is_better: bool = True,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[CheckpointRow], int]:
    """A page of an experiment's (or a trial's) checkpoints and their count.

    Ordered best searcher metric first (``by_metric``; unvalidated ones last) or most steps first.
    """
    where = _Where()
    if experiment_id is not None:
        where.add("experiment_id = {}", experiment_id)
    if trial_id is not None:
        where.add("trial_id = {}", trial_id)
    if state != "all":
        where.add("state = {}", state)
    direction = "ASC" if smaller_is_better else "DESC"
    steps = "steps_completed DESC, reported_at DESC, uuid"
    order = f"searcher_metric {direction} NULLS LAST, {steps}" if by_metric else steps
    rows, total = await where.page(
        conn, _CHECKPOINT_COLUMNS, "tr_checkpoints", order, limit, offset
    )
    return cast(list[CheckpointRow], rows), total


async def checkpoint(conn: Connection, uuid: str) -> CheckpointRow | None:
    """One checkpoint, or ``None``."""
    rows = await _rows(
        conn, f"SELECT {_CHECKPOINT_COLUMNS} FROM tr_checkpoints WHERE uuid = $1", uuid
    )
    return cast(CheckpointRow, rows[0]) if rows else None


# --- agents and the cluster -----------------------------------------------------------------


async def list_slots(conn: Connection, agent_id: str | None = None) -> list[SlotRow]:
    """Every slot (of one agent, or of all), by agent and slot id."""
    rows = await _rows(
        conn,
        """SELECT agent_id, slot_id, device, name, enabled, draining, allocation_id
           FROM tr_slots WHERE $1::text IS NULL OR agent_id = $1
           ORDER BY agent_id, slot_id""",
        agent_id,
    )
    return cast(list[SlotRow], rows)


async def list_agents(conn: Connection, agent_id: str | None = None) -> list[AgentRow]:
    """Every agent (or one), by agent id."""
    rows = await _rows(
        conn,
        """SELECT agent_id, resource_pool, hostname, state, registered_at, lost_at
           FROM tr_agents WHERE $1::text IS NULL OR agent_id = $1
           ORDER BY agent_id""",
        agent_id,
    )
    return cast(list[AgentRow], rows)


async def enabled_slots(conn: Connection) -> int:
    """How many slots are enabled."""
    return await _count(conn, "SELECT count(*) FROM tr_slots WHERE enabled")


async def waiting_trials(conn: Connection, limit: int = 10_000) -> list[WaitingTrialRow]:
    """Active trials of active experiments that hold no allocation, by request time."""
    rows = await _rows(
        conn,
        """SELECT t.trial_id, t.experiment_id, e.name, e.owner, e.resource_pool,
                  e.config -> 'resources' ->> 'priority' AS priority,
                  e.config -> 'resources' ->> 'slots_per_trial' AS slots, t.requested_at
           FROM tr_trials t JOIN tr_experiments e USING (experiment_id)
           WHERE e.state = 'ACTIVE' AND t.state = 'ACTIVE'
             AND NOT EXISTS (SELECT 1 FROM tr_allocations a
                             WHERE a.trial_id = t.trial_id AND a.state <> 'TERMINATED')
           ORDER BY t.requested_at, t.trial_id
           LIMIT $1""",
        limit,
    )
    return cast(list[WaitingTrialRow], rows)


async def live_allocations(conn: Connection, limit: int = 10_000) -> list[LiveAllocationRow]:
    """The allocations not yet terminated, by allocation id, with their experiment's owner."""
    rows = await _rows(
        conn,
        """SELECT a.allocation_id, a.trial_id, a.experiment_id, a.state, a.agent_id, e.owner
           FROM tr_allocations a JOIN tr_experiments e USING (experiment_id)
           WHERE a.state <> 'TERMINATED' ORDER BY a.allocation_id LIMIT $1""",
        limit,
    )
    return cast(list[LiveAllocationRow], rows)


async def allocation_spans(conn: Connection, since: datetime) -> list[AllocationSpanRow]:
    """When each allocation that held slots at or after ``since`` held them."""
    rows = await _rows(
        conn,
        """SELECT coalesce(started_at, allocated_at) AS since, ended_at, placements
           FROM tr_allocations WHERE ended_at IS NULL OR ended_at > $1""",
        since,
    )
    return cast(list[AllocationSpanRow], rows)


# --- audit trail ----------------------------------------------------------------------------


async def audit_page(
    conn: Connection,
    *,
    actor: str | None,
    experiment_id: int | None,
    type: str | None,
    request_id: str | None,
    since: datetime | None,
    until: datetime | None,
    before: int | None,
    limit: int,
) -> list[AuditRow]:
    """Audit trail rows matching every filter given, newest first, positions below ``before``."""
    rows = await _rows(
        conn,
        """SELECT position, recorded_at, type, stream_id, actor, request_id, remote,
                  experiment_id, trial_id, detail
           FROM audit_trail
           WHERE ($1::text IS NULL OR actor = $1)
             AND ($2::bigint IS NULL OR experiment_id = $2)
             AND ($3::text IS NULL OR type = $3)
             AND ($4::text IS NULL OR request_id = $4)
             AND ($5::timestamptz IS NULL OR recorded_at >= $5)
             AND ($6::timestamptz IS NULL OR recorded_at < $6)
             AND ($7::bigint IS NULL OR position < $7)
           ORDER BY position DESC LIMIT $8""",
        actor,
        experiment_id,
        type,
        request_id,
        since,
        until,
        before,
        limit,
    )
    return cast(list[AuditRow], rows)


# ------------------------------------------------------------- chart series and usage billing
# Their SQL lives with the code that writes the same tables (``series`` for the rollups,
# ``usage`` for the billing projection), each of which keeps its path's statements together;
# other services reach them only through the names below.

SeriesBuckets = series.SeriesBuckets
"""One series' buckets (see :class:`services.tracker.series.SeriesBuckets`)."""
UsageBy = usage.By
"""How a usage report groups: ``user``, ``pool``, ``experiment`` or ``day``."""
USAGE_CSV_COLUMNS = usage.CSV_COLUMNS
"""The CSV header of each usage grouping."""
epoch_ms = usage.epoch_ms
slot_seconds_text = usage.slot_seconds_text


async def projections_position(conn: Connection) -> int:
    """The tracker's projection checkpoint: its tables reflect the log at least up to it."""
    return await series.position(conn, projections.NAME)


async def series_trial_count(conn: Connection, experiment_id: int) -> int:
    """How many trials an experiment has."""
    return await series.trial_count(conn, experiment_id)


async def series_trial_ids(conn: Connection, experiment_id: int) -> list[int]:
    """The ids of an experiment's trials, in order."""
    return await series.trial_ids(conn, experiment_id)


async def series_metric_names(conn: Connection, experiment_id: int) -> dict[str, list[str]]:
    """Metric names by group (see :func:`services.tracker.series.metric_names`)."""
    return await series.metric_names(conn, experiment_id)


async def experiment_series_width(
    conn: Connection, experiment_id: int, group: str, metric: str, buckets: int
) -> int:
    """The power-of-two bucket width of an experiment's chart of about ``buckets`` buckets."""
    return await series.experiment_width(conn, experiment_id, group, metric, buckets)


async def experiment_series(
    conn: Connection, experiment_id: int, group: str, metric: str, width: int
) -> list[SeriesBuckets]:
    """Every trial's series of one metric in buckets of ``width`` steps (a power of two)."""
    return await series.experiment_series(conn, experiment_id, group, metric, width)


async def trial_series(conn: Connection, trial_id: int, buckets: int) -> list[SeriesBuckets]:
    """Every (group, metric) series of one trial in about ``buckets`` buckets."""
    return await series.trial_series(conn, trial_id, buckets)


async def usage_report(
    conn: Connection,
    start_ms: int,
    end_ms: int,
    by: str,
    *,
    owner: str | None = None,
    now_ms: int | None = None,
) -> list[dict[str, Any]]:
    """Slot-milliseconds in ``[start_ms, end_ms)`` grouped by ``by`` and slot type (``owner``:
    only their experiments; an open allocation counts up to ``now_ms``)."""
    return await usage.usage_report(conn, start_ms, end_ms, by, owner=owner, now_ms=now_ms)
