"""The tracker's reads of experiments, their trials, allocations and reported metrics."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypedDict, cast

from events.log.db import Connection
from services.tracker.read.sql import Where, fetch_rows


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
    project_id: int


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


class MetricRow(TypedDict):
    """One reported point of ``tr_metrics``."""

    run_id: int
    group: str
    steps_completed: int
    metrics: dict[str, Any]
    archived: bool
    reported_at: datetime


# --- experiments ----------------------------------------------------------------------------

_EXPERIMENT_COLUMNS = """
    e.experiment_id AS id, e.name, e.owner, e.state, e.archived, e.searcher_name,
    e.searcher_metric, e.smaller_is_better, e.num_trials, e.max_trials, e.best_trial_id,
    e.best_metric, e.resource_pool, e.submitted_at, e.ended_at, e.unmanaged, e.project_id,
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
    projects: Sequence[int] | None = None,
    visible_to: tuple[str, Sequence[int]] | None = None,
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
        projects: keep these projects' only.
        visible_to: ``(user, projects)``: keep the user's own and those in these projects (the
            ones where the user's roles let them see others' experiments).
    """
    where = Where()
    if projects is not None:
        where.add("e.project_id = ANY({}::bigint[])", list(projects))
    if visible_to is not None:
        where.add("(e.owner = {} OR e.project_id = ANY({}::bigint[]))", *visible_to)
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
    rows = await fetch_rows(
        conn,
        f"SELECT {_EXPERIMENT_COLUMNS} FROM tr_experiments e WHERE e.experiment_id = $1",
        experiment_id,
    )
    return cast(ExperimentRow, rows[0]) if rows else None


async def experiments_of_trials(conn: Connection, experiment_ids: Sequence[int]) -> dict[int, int]:
    """Trial id -> experiment id, for every trial of these experiments."""
    rows = await fetch_rows(
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
    where = Where()
    where.add("experiment_id = {}", experiment_id)
    if states is not None:
        where.add("state = ANY({}::text[])", list(states))
    direction = "ASC" if smaller_is_better else "DESC"
    order = f"best_metric {direction} NULLS LAST, seq" if best_first else "seq"
    rows, total = await where.page(conn, _TRIAL_COLUMNS, "tr_trials", order, limit, offset)
    return cast(list[TrialRow], rows), total


async def trial(conn: Connection, trial_id: int) -> TrialRow | None:
    """One trial, or ``None``."""
    rows = await fetch_rows(
        conn, f"SELECT {_TRIAL_COLUMNS} FROM tr_trials WHERE trial_id = $1", trial_id
    )
    return cast(TrialRow, rows[0]) if rows else None


async def allocations_of(conn: Connection, trial_id: int) -> list[AllocationRow]:
    """A trial's allocations by run."""
    rows = await fetch_rows(
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
    rows = await fetch_rows(
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
