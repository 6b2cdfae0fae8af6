"""Bucket widths of chart series and rollups (``services.tracker.series``)."""

from __future__ import annotations

import itertools

from services.tracker.series import LEVEL_BUCKETS, level_widths, power_width


def test_power_width_is_the_smallest_power_of_two_that_covers_every_step() -> None:
    """``buckets`` buckets of the width cover steps 0..max_steps; half of it would not."""
    for top in (0, 1, 7, 63, 64, 999, 1000, 1023, 1024, 4998, 10**9):
        for buckets in (1, 3, 16, 100, 300, 1024, 2000):
            width = power_width(top, buckets)
            assert width >= 1 and width & (width - 1) == 0
            assert top // width < buckets
            assert width == 1 or top // (width // 2) >= buckets
    assert power_width(1000, 100) == 16 and power_width(-5, 10) == 1


def test_levels_nest_and_bound_their_bucket_counts() -> None:
    """Each stored width divides every coarser one (so buckets nest) and none holds more than
    the finest level's bucket budget."""
    for top in (0, 5, 1000, 4998, 123_456):
        widths = level_widths(top)
        assert widths == sorted(set(widths))
        assert all(b % a == 0 for a, b in itertools.pairwise(widths))
        assert widths[0] == power_width(top, LEVEL_BUCKETS[0])
        assert all(top // w < LEVEL_BUCKETS[0] for w in widths)
