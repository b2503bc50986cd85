"""The console's time windows and the buckets their charts are drawn in."""

from __future__ import annotations

from datetime import datetime, timedelta

# Window length (minutes) -> bucket length (minutes): 12 to 28 bars each.
THROUGHPUT_WINDOWS: dict[int, int] = {15: 1, 60: 5, 180: 15, 1440: 60, 10080: 360}


def bucket_bounds(window_minutes: int, now: datetime) -> tuple[datetime, timedelta, int]:
    """(start, bucket length, bucket count) of a window ending with the bucket holding `now`.

    Buckets are aligned to the bucket length from midnight (every length divides
    a day), so the bars do not shift by a few seconds at every refresh.
    """
    if window_minutes not in THROUGHPUT_WINDOWS:
        raise ValueError(
            f"window_minutes must be one of {sorted(THROUGHPUT_WINDOWS)}, got {window_minutes!r}"
        )
    bucket = THROUGHPUT_WINDOWS[window_minutes]
    floor = now.replace(second=0, microsecond=0)
    floor -= timedelta(minutes=(floor.hour * 60 + floor.minute) % bucket)
    step = timedelta(minutes=bucket)
    return floor + step - timedelta(minutes=window_minutes), step, window_minutes // bucket
