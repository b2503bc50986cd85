"""The throughput chart's axis: every label names the value of its line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leasing.console.backlog import Throughput, ThroughputBucket
from leasing.console.charts import throughput_chart


def throughput(*finished: int) -> Throughput:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    buckets = tuple(
        ThroughputBucket(start=start + timedelta(minutes=5 * i), completed=n, failed=0)
        for i, n in enumerate(finished)
    )
    return Throughput(window_minutes=5 * len(buckets), bucket_minutes=5, buckets=buckets)


@pytest.mark.parametrize(
    ("finished", "labels"),
    [
        ((0, 0), [0, 1]),  # nothing finished: no second "0" half-way up
        ((1, 0), [0, 1]),
        ((3, 1), [0, 5]),  # not "2" at 2.5
        ((7, 2), [0, 5, 10]),
        ((150,), [0, 100, 200]),
    ],
)
def test_gridline_labels_are_the_values_of_their_lines(finished, labels):
    chart = throughput_chart(throughput(*finished))
    assert [value for _, value in chart.gridlines] == labels
    for y, value in chart.gridlines:
        expected = chart.baseline - chart.plot_height * value / chart.axis_max
        assert y == pytest.approx(expected, abs=0.1)
