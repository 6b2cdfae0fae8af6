"""Downsampling of metric series for charts: per bucket of steps, the first, last, lowest and
highest point (M4), so a chart of a few hundred buckets draws the same picture as every point.

The database groups points into buckets and reports those four per bucket (see
:mod:`services.api.routes_series`); :func:`merge_bucket` turns one bucket's four into the
distinct points in step order. Buckets split the step axis into equal widths, shared by every
series of one chart, so a bucket is about one pixel column wide whatever the series' length.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MIN_BUCKETS = 16
MAX_BUCKETS = 2000
POINT_BUDGET = 200_000
"""Most points one response should carry across all its series (4 per bucket at most)."""


def bucket_count(requested: int, series: int) -> int:
    """How many buckets each of ``series`` series gets: ``requested``, lowered so that the
    response stays within :data:`POINT_BUDGET` points, and never below :data:`MIN_BUCKETS`."""
    per_series = POINT_BUDGET // max(1, 4 * series)
    return max(MIN_BUCKETS, min(requested, MAX_BUCKETS, per_series))


def bucket_width(max_steps: int, buckets: int) -> int:
    """Steps per bucket so that ``buckets`` buckets cover steps ``0..max_steps``."""
    return max(1, -(-(max_steps + 1) // max(1, buckets)))


def merge_bucket(corners: Iterable[Sequence[float] | None]) -> list[tuple[int, float]]:
    """One bucket's representative points ``(steps, value)``, distinct by step, in step order.

    Args:
        corners: the bucket's first, last, lowest and highest points as ``[steps, value]`` or
            ``[value, steps]`` pairs already normalised to ``(steps, value)``; ``None`` entries
            are skipped.
    """
    seen: dict[int, float] = {}
    for pair in corners:
        if pair is None:
            continue
        seen.setdefault(int(pair[0]), float(pair[1]))
    return sorted(seen.items())


def append_points(steps: list[int], values: list[float], points: list[tuple[int, float]]) -> None:
    """Appends ``points`` (already in step order, after what ``steps`` holds) to the columns."""
    for x, y in points:
        steps.append(x)
        values.append(y)
