"""The tracker's reads of checkpoints."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypedDict, cast

from events.log.db import Connection
from services.tracker.read.sql import Where, fetch_rows

CheckpointState = Literal["COMPLETED", "DELETED", "all"]
"""Which checkpoints a listing keeps: completed, deleted or all."""


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
    where = Where()
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
    rows = await fetch_rows(
        conn, f"SELECT {_CHECKPOINT_COLUMNS} FROM tr_checkpoints WHERE uuid = $1", uuid
    )
    return cast(CheckpointRow, rows[0]) if rows else None
