"""Leasing: exactly-once-in-effect work items for Django.

The public API is re-exported lazily so that importing this package never
touches settings or models.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Lease",
    "LeaseManager",
    "enqueue",
    "enqueue_many",
]


def __getattr__(name: str) -> Any:
    if name in ("Lease", "LeaseManager"):
        from . import lease

        return getattr(lease, name)
    if name in ("enqueue", "enqueue_many"):
        from . import enqueue

        return getattr(enqueue, name)
    raise AttributeError(f"module 'leasing' has no attribute {name!r}")
