"""The tracker's projection of experiment facts: ``tr_experiments`` rows, their settings, their
state and their deletion (every ``tr_*`` row of the experiment). Part of
:mod:`services.tracker.projections`, which applies these in log order."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from events.domain.aggregates import SettingsChange, apply_settings
from events.domain.config.experiment_settings import ExperimentSettings
from events.domain.lifecycle import (
    DELETED,
    TERMINAL,
    can_continue,
    initial_experiment_state,
    next_experiment_state,
)
from events.domain.types import (
    ExperimentArchived,
    ExperimentContinued,
    ExperimentMoved,
    ExperimentStateChanged,
    ExperimentSubmitted,
)
from events.log.db import Connection
from services.tracker import schema


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


async def _state(conn: Connection, experiment_id: int) -> str | None:
    """The projected state of an experiment (``None``: not projected)."""
    current = await conn.fetchval(
        "SELECT state FROM tr_experiments WHERE experiment_id = $1", experiment_id
    )
    return None if current is None else str(current)


async def experiment_submitted(
    conn: Connection, e: ExperimentSubmitted, at: datetime, position: int
) -> None:
    """Inserts the experiment's row from its config (a repeat changes nothing)."""
    settings = e.settings
    await conn.execute(
        """INSERT INTO tr_experiments (experiment_id, name, description, labels, owner, state,
               archived, searcher_name, searcher_metric, smaller_is_better, max_trials, config,
               code_ref, resource_pool, num_trials, submitted_at, position, unmanaged,
               project_id)
           VALUES ($1, $2, $3, $4, $5, $6, false, $7, $8, $9, $10, $11, $12, $13, 0, $14, $15,
                   $16, $17)
           ON CONFLICT (experiment_id) DO NOTHING""",
        e.experiment_id,
        settings.name or "",
        settings.description or "",
        list(settings.labels),
        e.owner,
        initial_experiment_state(e.activate),
        settings.searcher_name or "",
        settings.metric or "",
        settings.smaller_is_better,
        settings.max_trials,
        e.config,
        e.code_ref,
        settings.pool or "default",
        at,
        position,
        e.unmanaged,
        e.project_id,
    )


async def experiment_state(conn: Connection, e: ExperimentStateChanged, at: datetime) -> None:
    """Moves the experiment's state (as the state machine allows); DELETED removes its rows."""
    current = await _state(conn, e.experiment_id)
    if current is None or next_experiment_state(current, e.state) is None:
        return  # refused by the state machine: never applied
    if e.state == DELETED:
        await delete_experiment(conn, e.experiment_id)
        return
    await conn.execute(
        """UPDATE tr_experiments
           SET state = $2, ended_at = CASE WHEN $2 = ANY($3::text[]) THEN $4 ELSE ended_at END
           WHERE experiment_id = $1""",
        e.experiment_id,
        e.state,
        sorted(TERMINAL),
        at,
    )


async def experiment_archived(conn: Connection, e: ExperimentArchived) -> None:
    """Sets the experiment's ``archived`` flag."""
    await conn.execute(
        "UPDATE tr_experiments SET archived = $2 WHERE experiment_id = $1",
        e.experiment_id,
        e.archived,
    )


async def experiment_moved(conn: Connection, e: ExperimentMoved) -> None:
    """Sets the experiment's project."""
    await conn.execute(
        "UPDATE tr_experiments SET project_id = $2 WHERE experiment_id = $1",
        e.experiment_id,
        e.project_id,
    )


async def experiment_setting(conn: Connection, e: SettingsChange) -> None:
    """A user's change of name, description, labels or resources: the config changed by the
    experiment fold's own rule (:func:`~events.domain.aggregates.apply_settings`), and the
    columns that show it."""
    config = await conn.fetchval(
        "SELECT config FROM tr_experiments WHERE experiment_id = $1", e.experiment_id
    )
    if config is None:
        return
    changed = apply_settings(_mapping(config), e)
    settings = ExperimentSettings.of(changed)
    await conn.execute(
        """UPDATE tr_experiments SET config = $2, name = $3, description = $4, labels = $5
           WHERE experiment_id = $1""",
        e.experiment_id,
        changed,
        settings.name or "",
        settings.description or "",
        list(settings.labels),
    )


async def experiment_continued(conn: Connection, e: ExperimentContinued) -> None:
    """An ended experiment is ACTIVE again with its new config, and its continued trials'
    hparams."""
    current = await _state(conn, e.experiment_id)
    if current is None or not can_continue(current):
        return  # the folds refuse it too: never applied
    await conn.execute(
        """UPDATE tr_experiments SET state = 'ACTIVE', ended_at = NULL, config = $2,
               name = $3, description = $4
           WHERE experiment_id = $1""",
        e.experiment_id,
        e.config,
        e.settings.name or "",
        e.settings.description or "",
    )
    for trial in e.trials:
        await conn.execute(
            "UPDATE tr_trials SET hparams = $2 WHERE trial_id = $1", trial.trial_id, trial.hparams
        )


async def delete_experiment(conn: Connection, experiment_id: int) -> None:
    """Removes every row of an experiment from every ``tr_*`` table."""
    await conn.execute(
        """UPDATE tr_slots SET allocation_id = NULL
           WHERE allocation_id IN
               (SELECT allocation_id FROM tr_allocations WHERE experiment_id = $1)""",
        experiment_id,
    )
    for table in reversed(schema.TABLES):
        if table in ("tr_agents", "tr_slots"):
            continue
        await conn.execute(f"DELETE FROM {table} WHERE experiment_id = $1", experiment_id)
