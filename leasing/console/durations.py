"""Durations as the console writes them: `95` -> `1 min 35 s`."""

from __future__ import annotations

from datetime import datetime

EMPTY = "—"


def duration(seconds: float) -> str:
    """Two units at most, short enough for a table cell."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 10:
        return f"{minutes} min {seconds} s" if seconds else f"{minutes} min"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def humanize_seconds(seconds: float | None) -> str:
    """A duration for display (`—` for None)."""
    return EMPTY if seconds is None else duration(seconds)


def age(now: datetime, then: datetime | None) -> float | None:
    """Seconds from `then` to `now`, never negative; None when `then` is None."""
    return None if then is None else max(0.0, (now - then).total_seconds())
