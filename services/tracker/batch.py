"""Applies runs of metric reports to ``tr_metrics`` in a few statements instead of one per event.

Metric reports (``WorkloadCompleted``, ``ValidationReported``, ``MetricsReported``) are most of
the log. A run of consecutive reports in a page is applied as: one lookup of the trials'
experiments, one multi-row upsert of the points, one archive of rolled-back rows, the chart
buckets kept (:func:`services.tracker.series.keep_buckets`: appended in a statement or two, or
recomputed for a trial whose rows were rolled back), one update of the trials'
``steps_completed``, then each validation's own effects in order.

Invariant: the result equals applying the reports one by one (``project_metrics.metrics``). That
holds because a run is cut before a report whose trial already appears in it with another
``run_id``, so within a run each trial reports from one run ``r`` only:

- the points are distinct rows per (trial, run, group, step); a repeated key keeps the last;
- report ``i`` at step ``s_i`` archives earlier runs' unarchived rows beyond ``s_i``; their union
  is those beyond ``min(s_i)``, and rows of run ``r`` are never among them;
- report ``i`` sets ``steps_completed`` to ``s_i`` when it archived something, else raises it to
  ``s_i``: replayed in Python over the steps of the rows the run archives (fetched first).

Validation effects read and write columns no point touches, so applying them after the points
keeps their order among themselves, which is all they depend on. Nothing else may interleave:
the caller flushes the run before any other event.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson

from events.domain.types import MetricsReported, ValidationReported, WorkloadCompleted
from events.log.db import Connection
from services.tracker.series import NewPoint, keep_buckets

Report = WorkloadCompleted | ValidationReported | MetricsReported


@dataclass(frozen=True)
class Point:
    """One metric report and when it was recorded."""

    event: Report
    at: datetime


class MetricRun:
    """Consecutive metric reports waiting to be applied together."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self._runs: dict[int, int] = {}

    def __bool__(self) -> bool:
        return bool(self.points)

    def fits(self, event: Report) -> bool:
        """Whether ``event`` can join (its trial reports from no other run here)."""
        run = self._runs.get(event.trial_id)
        return run is None or run == event.run_id

    def holds(self, trial_id: int) -> bool:
        """Whether a report of trial ``trial_id`` waits here."""
        return trial_id in self._runs

    def add(self, event: Report, at: datetime) -> None:
        """Appends a report (check :meth:`fits` first)."""
        self._runs[event.trial_id] = event.run_id
        self.points.append(Point(event, at))

    def clear(self) -> None:
        """Empties the run after it was applied."""
        self.points.clear()
        self._runs.clear()


def group_of(e: Report) -> str:
    """The metric group a report writes to."""
    if isinstance(e, WorkloadCompleted):
        return "training"
    if isinstance(e, ValidationReported):
        return "validation"
    return e.group


def _metrics_json(metrics: dict[str, float]) -> str:
    """A report's metrics as JSON text for a jsonb column: orjson's text (the same jsonb value
    as the standard encoder's, several times faster); a non-finite value keeps the standard
    text, which PostgreSQL refuses, as it refuses the event applied on its own."""
    if all(math.isfinite(v) for v in metrics.values()):
        return orjson.dumps(metrics).decode()
    return json.dumps(metrics, separators=(",", ":"))


def final_steps(current: int, steps: Sequence[int], archivable: Sequence[int]) -> int:
    """A trial's ``steps_completed`` after reports at ``steps`` (in order), from ``current``,
    given the steps of earlier runs' unarchived rows (``archivable``) before the first report.

    A report at ``s`` archives the rows beyond ``s`` still unarchived (those at or below every
    earlier report's step); when it archives any, the value becomes ``s``, else ``max(v, s)``.
    """
    value = current
    ceiling: int | None = None  # rows above it were archived by an earlier report
    for s in steps:
        archived = any(a > s and (ceiling is None or a <= ceiling) for a in archivable)
        value = s if archived else max(value, s)
        ceiling = s if ceiling is None else min(ceiling, s)
    return value


async def apply_run(conn: Connection, run: MetricRun) -> list[tuple[ValidationReported, int]]:
    """Applies the points of ``run``; returns the validations (with their experiment) whose own
    effects the caller applies next, in order."""
    trial_ids = sorted({p.event.trial_id for p in run.points})
    found = await conn.fetch(
        "SELECT trial_id, experiment_id FROM tr_trials WHERE trial_id = ANY($1::bigint[])",
        trial_ids,
    )
    experiments = {int(r["trial_id"]): int(r["experiment_id"]) for r in found}
    points = [p for p in run.points if p.event.trial_id in experiments]
    if not points:
        return []
    rows: dict[tuple[int, int, str, int], Point] = {}
    low: dict[int, int] = {}
    steps: dict[int, list[int]] = defaultdict(list)
    for p in points:
        e = p.event
        rows[(e.trial_id, e.run_id, group_of(e), e.steps_completed)] = p  # the last one wins
        low[e.trial_id] = min(low.get(e.trial_id, e.steps_completed), e.steps_completed)
        steps[e.trial_id].append(e.steps_completed)
    runs = {p.event.trial_id: p.event.run_id for p in points}
    ids = sorted(low)
    # The rows this run archives, before anything is written (for steps_completed).
    archivable: dict[int, list[int]] = defaultdict(list)
    for r in await conn.fetch(
        """SELECT m.trial_id, m.steps_completed
           FROM tr_metrics m
           JOIN unnest($1::bigint[], $2::int[], $3::bigint[]) AS u(trial_id, run_id, low)
             ON m.trial_id = u.trial_id AND m.run_id < u.run_id AND m.steps_completed > u.low
           WHERE NOT m.archived""",
        ids,
        [runs[t] for t in ids],
        [low[t] for t in ids],
    ):
        archivable[int(r["trial_id"])].append(int(r["steps_completed"]))
    keys = list(rows)
    await conn.execute(
        """INSERT INTO tr_metrics (trial_id, experiment_id, run_id, "group", steps_completed,
                                   metrics, archived, reported_at)
           SELECT u.trial_id, u.experiment_id, u.run_id, u.grp, u.steps, u.metrics::jsonb, false,
                  u.at
           FROM unnest($1::bigint[], $2::bigint[], $3::int[], $4::text[], $5::bigint[],
                       $6::text[], $7::timestamptz[])
                AS u(trial_id, experiment_id, run_id, grp, steps, metrics, at)
           ON CONFLICT (trial_id, run_id, "group", steps_completed) DO UPDATE
           SET metrics = excluded.metrics, archived = false, reported_at = excluded.reported_at""",
        [k[0] for k in keys],
        [experiments[k[0]] for k in keys],
        [k[1] for k in keys],
        [k[2] for k in keys],
        [k[3] for k in keys],
        [_metrics_json(dict(rows[k].event.metrics)) for k in keys],
        [rows[k].at for k in keys],
    )
    if archivable:
        arch = sorted(archivable)
        await conn.execute(
            """UPDATE tr_metrics m SET archived = true
               FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS u(trial_id, run_id, low)
               WHERE m.trial_id = u.trial_id AND m.run_id < u.run_id
                 AND m.steps_completed > u.low AND NOT m.archived""",
            arch,
            [runs[t] for t in arch],
            [low[t] for t in arch],
        )
    await keep_buckets(
        conn,
        [NewPoint(k[0], experiments[k[0]], k[2], k[3], rows[k].event.metrics) for k in keys],
        rebuild=archivable,
    )
    current = {
        int(r["trial_id"]): int(r["steps_completed"])
        for r in await conn.fetch(
            "SELECT trial_id, steps_completed FROM tr_trials WHERE trial_id = ANY($1::bigint[])",
            ids,
        )
    }
    await conn.execute(
        """UPDATE tr_trials t SET steps_completed = u.steps
           FROM unnest($1::bigint[], $2::bigint[]) AS u(trial_id, steps)
           WHERE t.trial_id = u.trial_id""",
        ids,
        [final_steps(current.get(t, 0), steps[t], archivable.get(t, ())) for t in ids],
    )
    return [
        (p.event, experiments[p.event.trial_id])
        for p in points
        if isinstance(p.event, ValidationReported)
    ]
