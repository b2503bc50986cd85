"""The recovery sweep (the watchdog) behind `python manage.py recoverysweep`.

    from leasing.sweep import RecoverySweep

    stats = RecoverySweep(scan_interval_seconds=60).scan_and_recover()

`sweep` holds the pass and its thread, `stats` what a pass reports,
`schedule` the django-q2 scheduling.
"""

from .stats import RecoveryStats, describe
from .sweep import RecoverySweep

__all__ = ["RecoveryStats", "RecoverySweep", "describe"]
