"""The tracker's projection of reports: ``tr_metrics`` points, a validation's effects on its
trial, checkpoint and experiment, and ``tr_checkpoints`` rows. Part of
:mod:`services.tracker.projections`, which applies these in log order (runs of metric reports
in batches, :mod:`services.tracker.batch`, equal to :func:`metrics` one at a time)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from events.domain.aggregates import metric_value
from events.domain.types import (
    CheckpointSaved,
    CheckpointsDeleted,
    MetricsReported,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.db import Connection
from services.tracker import series
from services.tracker.batch import group_of
from services.tracker.project_trials import experiment_of_trial


def validation_doc(run_id: int, steps_completed: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON kept as a trial's ``latest_validation`` and a checkpoint's ``validation``."""
    return {"run_id": run_id, "steps_completed": steps_completed, "metrics": dict(metrics)}


async def metrics(
    conn: Connection,
    e: WorkloadCompleted | ValidationReported | MetricsReported,
    at: datetime,
) -> None:
    """One report: its point, the rollback it implies, its trial's steps and a validation's
    effects."""
    experiment_id = await experiment_of_trial(conn, e.trial_id)
    if experiment_id is None:
        return
    # One statement: upsert the point (a repeat un-archives it), apply Determined's rollback
    # (a run reporting at step s archives earlier runs' rows beyond s, every group), and move
    # the trial's steps_completed (back to s when this report rolled something back); it
    # answers whether it rolled anything back.
    rolled_back = await conn.fetchval(
        """WITH ins AS (
               INSERT INTO tr_metrics (trial_id, experiment_id, run_id, "group", steps_completed,
                                       metrics, archived, reported_at)
               VALUES ($1, $2, $3, $4, $5, $6, false, $7)
               ON CONFLICT (trial_id, run_id, "group", steps_completed) DO UPDATE
               SET metrics = excluded.metrics, archived = false,
                   reported_at = excluded.reported_at
               RETURNING 1),
           arch AS (
               UPDATE tr_metrics SET archived = true
               WHERE trial_id = $1 AND run_id < $3 AND steps_completed > $5 AND NOT archived
               RETURNING 1),
           steps AS (
               UPDATE tr_trials
               SET steps_completed = CASE WHEN EXISTS (SELECT 1 FROM arch) THEN $5
                                          ELSE greatest(steps_completed, $5) END
               WHERE trial_id = $1 AND EXISTS (SELECT 1 FROM ins)
               RETURNING 1)
           SELECT EXISTS (SELECT 1 FROM arch)""",
        e.trial_id,
        experiment_id,
        e.run_id,
        group_of(e),
        e.steps_completed,
        dict(e.metrics),
        at,
    )
    await series.keep_buckets(
        conn,
        [series.NewPoint(e.trial_id, experiment_id, group_of(e), e.steps_completed, e.metrics)],
        rebuild=[e.trial_id] if rolled_back else (),
    )
    if isinstance(e, ValidationReported):
        await validation_effects(conn, e, experiment_id)


async def validation_effects(conn: Connection, e: ValidationReported, experiment_id: int) -> None:
    """A validation's effects beyond its point: the trial's latest and best validation, the
    checkpoint of the same step, and the experiment's best trial."""
    row = await conn.fetchrow(
        "SELECT searcher_metric, smaller_is_better FROM tr_experiments WHERE experiment_id = $1",
        experiment_id,
    )
    name = str(row["searcher_metric"]) if row is not None else ""
    smaller = bool(row["smaller_is_better"]) if row is not None else True
    value = metric_value(e.metrics, name)
    doc = validation_doc(e.run_id, e.steps_completed, e.metrics)
    await conn.execute(
        """UPDATE tr_trials SET latest_validation = $2,
               best_metric = CASE WHEN $3::float8 IS NULL THEN best_metric
                                  WHEN best_metric IS NULL THEN $3::float8
                                  WHEN $4 THEN least(best_metric, $3::float8)
                                  ELSE greatest(best_metric, $3::float8) END
           WHERE trial_id = $1""",
        e.trial_id,
        doc,
        value,
        smaller,
    )
    await conn.execute(
        """UPDATE tr_checkpoints SET validation = $3, searcher_metric = $4
           WHERE trial_id = $1 AND steps_completed = $2""",
        e.trial_id,
        e.steps_completed,
        doc,
        value,
    )
    if value is not None:
        await conn.execute(
            """UPDATE tr_experiments SET best_metric = $3, best_trial_id = $2
               WHERE experiment_id = $1
                 AND (best_metric IS NULL OR ($4 AND $3 < best_metric)
                      OR (NOT $4 AND $3 > best_metric))""",
            experiment_id,
            e.trial_id,
            value,
            smaller,
        )


async def validations_effects(
    conn: Connection, validations: Sequence[tuple[ValidationReported, int]]
) -> None:
    """:func:`validation_effects` of ``validations`` (each with its experiment), in that order,
    in four statements whatever their number.

    Applied one by one, the effects end as: each trial's latest validation is its last one and
    its best the extreme of its values and the stored best; each checkpoint gets the last
    validation of its step; each experiment's best moves to the first validation that reaches
    the extreme of its values if that beats the stored best strictly (a tie keeps the earlier).
    """
    if len(validations) == 1:
        await validation_effects(conn, *validations[0])
        return
    rows = await conn.fetch(
        """SELECT experiment_id, searcher_metric, smaller_is_better FROM tr_experiments
           WHERE experiment_id = ANY($1::bigint[])""",
        sorted({experiment_id for _, experiment_id in validations}),
    )
    settings = {
        int(r["experiment_id"]): (str(r["searcher_metric"] or ""), bool(r["smaller_is_better"]))
        for r in rows
    }
    trials: dict[int, list[Any]] = {}  # trial -> [latest doc, best value, smaller]
    checkpoints: dict[tuple[int, int], tuple[str, float | None]] = {}
    experiments: dict[int, tuple[float, int, bool]] = {}  # -> (best value, its trial, smaller)
    for e, experiment_id in validations:
        name, smaller = settings.get(experiment_id, ("", True))
        value = metric_value(e.metrics, name)
        doc = _dumps(validation_doc(e.run_id, e.steps_completed, e.metrics))
        trial = trials.setdefault(e.trial_id, [doc, None, smaller])
        trial[0] = doc
        if value is not None and (trial[1] is None or _better(value, trial[1], smaller)):
            trial[1] = value
        checkpoints[(e.trial_id, e.steps_completed)] = (doc, value)
        if value is not None:
            best = experiments.get(experiment_id)
            if best is None or _better(value, best[0], smaller):
                experiments[experiment_id] = (value, e.trial_id, smaller)
    ids = sorted(trials)
    await conn.execute(
        """UPDATE tr_trials t SET latest_validation = u.doc::jsonb,
               best_metric = CASE WHEN u.v IS NULL THEN t.best_metric
                                  WHEN t.best_metric IS NULL THEN u.v
                                  WHEN u.smaller THEN least(t.best_metric, u.v)
                                  ELSE greatest(t.best_metric, u.v) END
           FROM unnest($1::bigint[], $2::text[], $3::float8[], $4::bool[])
                AS u(trial_id, doc, v, smaller)
           WHERE t.trial_id = u.trial_id""",
        ids,
        [trials[t][0] for t in ids],
        [trials[t][1] for t in ids],
        [trials[t][2] for t in ids],
    )
    steps = sorted(checkpoints)
    await conn.execute(
        """UPDATE tr_checkpoints c SET validation = u.doc::jsonb, searcher_metric = u.v
           FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::float8[])
                AS u(trial_id, steps, doc, v)
           WHERE c.trial_id = u.trial_id AND c.steps_completed = u.steps""",
        [t for t, _ in steps],
        [s for _, s in steps],
        [checkpoints[k][0] for k in steps],
        [checkpoints[k][1] for k in steps],
    )
    if experiments:
        exps = sorted(experiments)
        await conn.execute(
            """UPDATE tr_experiments x SET best_metric = u.v, best_trial_id = u.trial_id
               FROM unnest($1::bigint[], $2::float8[], $3::bigint[], $4::bool[])
                    AS u(experiment_id, v, trial_id, smaller)
               WHERE x.experiment_id = u.experiment_id
                 AND (x.best_metric IS NULL OR (u.smaller AND u.v < x.best_metric)
                      OR (NOT u.smaller AND u.v > x.best_metric))""",
            exps,
            [experiments[x][0] for x in exps],
            [experiments[x][1] for x in exps],
            [experiments[x][2] for x in exps],
        )


def _better(value: float, than: float, smaller: bool) -> bool:
    """Whether ``value`` beats ``than`` strictly."""
    return value < than if smaller else value > than


def _dumps(doc: dict[str, Any]) -> str:
    """A JSON document as the jsonb codec writes it."""
    return json.dumps(doc, separators=(",", ":"))


async def checkpoint_saved(conn: Connection, e: CheckpointSaved, at: datetime) -> None:
    """Inserts the checkpoint with the validation of its step (if reported yet) and makes it
    its trial's latest."""
    experiment_id = await experiment_of_trial(conn, e.trial_id)
    if experiment_id is None:
        return
    validation = await conn.fetchrow(
        """SELECT run_id, steps_completed, metrics FROM tr_metrics
           WHERE trial_id = $1 AND "group" = 'validation' AND steps_completed = $2
           ORDER BY run_id DESC LIMIT 1""",
        e.trial_id,
        e.steps_completed,
    )
    doc: dict[str, Any] | None = None
    value: float | None = None
    if validation is not None:
        doc = validation_doc(
            int(validation["run_id"]), int(validation["steps_completed"]), validation["metrics"]
        )
        name = await conn.fetchval(
            "SELECT searcher_metric FROM tr_experiments WHERE experiment_id = $1", experiment_id
        )
        value = metric_value(validation["metrics"], str(name) if name else None)
    await conn.execute(
        """INSERT INTO tr_checkpoints (uuid, trial_id, experiment_id, run_id, steps_completed,
                                      resources, metadata, state, reported_at, validation,
                                      searcher_metric)
           VALUES ($1, $2, $3, $4, $5, $6, $7, 'COMPLETED', $8, $9, $10)
           ON CONFLICT (uuid) DO NOTHING""",
        e.uuid,
        e.trial_id,
        experiment_id,
        e.run_id,
        e.steps_completed,
        dict(e.resources),
        dict(e.metadata),
        at,
        doc,
        value,
    )
    await conn.execute(
        "UPDATE tr_trials SET latest_checkpoint = $2 WHERE trial_id = $1", e.trial_id, e.uuid
    )


async def checkpoints_deleted(conn: Connection, e: CheckpointsDeleted, at: datetime) -> None:
    """Marks the checkpoints deleted (once)."""
    await conn.execute(
        """UPDATE tr_checkpoints SET state = 'DELETED', deleted_at = $2
           WHERE uuid = ANY($1::text[]) AND state <> 'DELETED'""",
        list(e.uuids),
        at,
    )
