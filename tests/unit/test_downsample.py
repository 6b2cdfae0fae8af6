"""Downsampling of chart series (``services.api.downsample``): bucket sizes and bucket points."""

from __future__ import annotations

from services.api.downsample import (
    MIN_BUCKETS,
    POINT_BUDGET,
    bucket_count,
    bucket_points,
)


def test_bucket_count_stays_within_the_point_budget() -> None:
    """Many series get fewer buckets (never fewer than the minimum); few get what they ask."""
    assert bucket_count(300, 1) == 300
    assert bucket_count(300, 1000) == POINT_BUDGET // 2000
    assert bucket_count(300, 10**6) == MIN_BUCKETS
    assert bucket_count(10**6, 1) == 2000


def test_bucket_points_keep_extremes_in_line_order() -> None:
    """A one-point bucket is that point; otherwise the low and high values span the bucket,
    ordered to continue from the previous value (high first when there is none)."""
    assert bucket_points(5, 5, 0.3, 0.3, None) == [(5, 0.3)]
    assert bucket_points(5, 9, 0.3, 0.3, 1.0) == [(5, 0.3), (9, 0.3)]
    assert bucket_points(5, 9, 0.1, 0.8, None) == [(5, 0.8), (9, 0.1)]
    assert bucket_points(5, 9, 0.1, 0.8, 0.9) == [(5, 0.8), (9, 0.1)]
    assert bucket_points(5, 9, 0.1, 0.8, 0.0) == [(5, 0.1), (9, 0.8)]
