"""Rate limits' state: the `leasing_rate_buckets` table, one row per limited bucket.

A bucket is `queue:<name>`, `work_type:<name>` or `key:<rate_key>`. Its row
holds the GCRA state (`tat`, the theoretical arrival time, in seconds since
the epoch of the database clock) and `next_at`, the earliest time it admits
another item, which the claim's gate compares with the database clock. A
`key:` bucket may also carry the limit an enqueue gave it (`limit_count`,
`period_seconds`, `burst`); queue and work type limits come from
`LEASING["RATE_LIMITS"]`.

Rows are written only by `leasing.sql.rates` (the claim, under the row lock,
and an enqueue with `rate_limit`).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class RateBucket(models.Model):
    bucket = models.TextField(primary_key=True)
    tat = models.FloatField(default=0.0, db_default=0.0)
    next_at = models.FloatField(default=0.0, db_default=0.0)
    limit_count = models.IntegerField(null=True, blank=True)
    period_seconds = models.FloatField(null=True, blank=True)
    burst = models.IntegerField(null=True, blank=True)
    admitted = models.BigIntegerField(default=0, db_default=0)
    # The console's rate: admissions in the current window of `WINDOW_SECONDS` (from
    # `window_start`, epoch seconds) and in the one before (`leasing.console.rates`).
    window_start = models.FloatField(default=0.0, db_default=0.0)
    window_admitted = models.IntegerField(default=0, db_default=0)
    previous_admitted = models.IntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "leasing_rate_buckets"
        ordering = ("bucket",)
        # The next opening of any closed bucket: how long an idle worker sleeps.
        indexes = [models.Index(fields=["next_at"], name="leasing_rate_buckets_next_idx")]

    def __str__(self) -> str:
        return self.bucket
