"""Downsampling of metric series for charts: the lowest and the highest value of each bucket of
steps, so a chart of a few hundred buckets keeps every spike and dip of a long series.

The tracker groups a series' points into buckets of equal width in steps (shared by every
series of one chart, so a bucket is about one pixel column whatever the series' length; see
:mod:`services.tracker.series`) and reports per bucket its first and last step and its lowest
and highest value. :func:`bucket_points` turns one bucket into at most two
points: a bucket of one point is that point exactly; otherwise the lowest and highest values are
placed at the bucket's first and last step, in the order that continues the line from the
previous bucket, so the drawn line spans the bucket's whole range of values.
"""

from __future__ import annotations

MIN_BUCKETS = 16
MAX_BUCKETS = 2000
POINT_BUDGET = 200_000
"""Most points one response should carry across all its series (2 per bucket at most)."""


def bucket_count(requested: int, series: int) -> int:
    """How many buckets each of ``series`` series gets: ``requested``, lowered so that the
    response stays within :data:`POINT_BUDGET` points, and never below :data:`MIN_BUCKETS`."""
    per_series = POINT_BUDGET // max(1, 2 * series)
    return max(MIN_BUCKETS, min(requested, MAX_BUCKETS, per_series))


def bucket_points(
    first: int, last: int, low: float, high: float, previous: float | None
) -> list[tuple[int, float]]:
    """One bucket's points ``(steps, value)`` in step order.

    Args:
        first: the bucket's first step.
        last: its last step.
        low: its lowest value.
        high: its highest value.
        previous: the value drawn last before this bucket (``None`` for a series' first bucket,
            which then starts from its highest value, as falling curves do).
    """
    if first == last or low == high:
        return [(first, low)] if first == last else [(first, low), (last, low)]
    if previous is not None and abs(previous - low) < abs(previous - high):
        return [(first, low), (last, high)]
    return [(first, high), (last, low)]


def append_points(steps: list[int], values: list[float], points: list[tuple[int, float]]) -> None:
    """Appends ``points`` (already in step order, after what ``steps`` holds) to the columns."""
    for x, y in points:
        steps.append(x)
        values.append(y)
