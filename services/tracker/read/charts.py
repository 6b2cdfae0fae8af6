"""The tracker's reads of chart series and usage billing.

Their SQL lives with the code that writes the same tables (``series`` for the rollups,
``usage`` for the billing projection), each of which keeps its path's statements together;
other services reach them only through the names below.
"""

from __future__ import annotations

from events.log.db import Connection
from services.tracker import projections, series, usage

SeriesBuckets = series.SeriesBuckets
"""One series' buckets (see :class:`services.tracker.series.SeriesBuckets`)."""
UsageBy = usage.By
"""How a usage report groups: ``user``, ``pool``, ``experiment``, ``project``, ``workspace``
or ``day``."""
USAGE_CSV_COLUMNS = usage.CSV_COLUMNS
"""The CSV header of each usage grouping."""
epoch_ms = usage.epoch_ms
usage_report = usage.usage_report
"""Slot-milliseconds in ``[start_ms, end_ms)`` grouped by ``by`` and slot type (``owner``: only
their experiments and tasks; an open allocation counts up to ``now_ms``; by ``workspace``,
``workspaces`` maps each project to its workspace: a task counts for its own)."""
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
