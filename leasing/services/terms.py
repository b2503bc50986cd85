"""The numbers and filters a claim or release is made with, validated once.

API callers pass raw values (None meaning "the LEASING setting"); these
helpers turn them into the validated values the statements take. The worker
runtime builds its terms once at start-up (`leasing.worker.options`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .. import validation
from ..conf import RETRY_JITTER, get_settings
from ..exceptions import InvalidInput
from ..sql.limits import Limits
from ..sql.snapshots import MAX_ERROR_CHARS, clean_text
from ..sql.terms import ClaimFilters, LeaseTerms


def retry_backoff_seconds(retry_count: int) -> float:
    """Exponential backoff with jitter for the retry after `retry_count` retries.

    base * 2**retry_count, capped at RETRY_BACKOFF_MAX, then spread by
    +/- RETRY_JITTER so that items failing together do not retry together.
    """
    conf = get_settings()
    delay = min(conf.retry_backoff_base * (2.0 ** min(retry_count, 60)), conf.retry_backoff_max)
    spread = delay * RETRY_JITTER
    return max(0.0, delay + random.uniform(-spread, spread))


def error_text(error: str | BaseException | None) -> str | None:
    """The item's `error_message` for an error: bounded, and storable by any database."""
    if error is None:
        return None
    if isinstance(error, BaseException):
        text = f"{type(error).__name__}: {error}"
    elif isinstance(error, str):
        text = error
    else:
        raise InvalidInput(f"error must be a string or an exception, got {error!r}.")
    return clean_text(text, MAX_ERROR_CHARS)


def claim_terms(
    lease_duration_seconds: float | None, *, cap_seconds: float | None = None
) -> LeaseTerms:
    """Validated `LeaseTerms` for API callers (None: the LEASING settings)."""
    conf = get_settings()
    duration = validation.positive_seconds(
        "lease_duration_seconds",
        conf.lease_duration if lease_duration_seconds is None else lease_duration_seconds,
    )
    cap = validation.positive_seconds(
        "cap_seconds", conf.max_lease_lifetime if cap_seconds is None else cap_seconds
    )
    return LeaseTerms(duration=duration, cap=cap)


def claim_filters(
    work_type_filter: str | Sequence[str] | None = None,
    task_id_filter: str | None = None,
    queue_filter: str | Sequence[str] | None = None,
) -> ClaimFilters:
    """Validated `ClaimFilters` for API callers."""
    task_ids = validation.text_filter("task_id_filter", task_id_filter)
    work_types = validation.text_filter("work_type_filter", work_type_filter)
    queues = validation.text_filter("queue_filter", queue_filter)
    return ClaimFilters(
        work_types=None if work_types is None else tuple(work_types),
        queues=None if queues is None else tuple(queues),
        task_ids=None if task_ids is None else tuple(task_ids),
    )


def claim_limits(filters: ClaimFilters) -> Limits:
    """The LEASING concurrency limits a claim with these filters may run into (often none)."""
    conf = get_settings()
    if not (conf.queue_limits or conf.work_type_limits):
        return Limits()
    return Limits.for_claim(
        conf.queue_limits, conf.work_type_limits, filters.queues, filters.work_types
    )
