"""Keeping leases alive: one mechanism, two policies.

A `LeaseKeeper` renews the leases it is given that are due, in one statement
per round, and says which were lost. Whether a lease is due is its policy's
call:

* `TIME` (a handler's `thread` heartbeat mode): every `period` seconds since
  its last renewal, whatever the handler does; it works for any code, and a
  process that dies stops renewing, which is what the sweep needs;
* `WORK` (the `beat` mode, proof of work): only after the handler beat since
  the last renewal, and at most once per `period`; a handler that is stuck
  stops beating and its lease runs out, so a stuck run is recovered and a slow
  but working one is not.

Whatever drives it, the decision and the renewal are the same code:
`HeartbeatThread` ticks a keeper for one lease on a thread of its own,
`LeaseExtender` consults one on each of the handler's beats, and the worker
runtime's renewer ticks one for every lease of its process
(`leasing.worker.renewer`). Each renewal records the handler's last beat as
`progress_at` (what the console shows as last progress).

Leases the database no longer shows as held (expired, past their deadline,
moved on) are reported through `on_lost` with the specific error; after
`max_failures` consecutive rounds the database failed, every lease of the
round is reported lost, as the process can no longer prove it is alive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import DatabaseError

from .exceptions import DatabaseUnavailable, LeaseExpiredError
from .sql.renewals import Renewal
from .sql.runner import close_connection

if TYPE_CHECKING:
    from .heartbeat import Heartbeat
    from .services.held import LeaseKey
    from .services.leases import LeaseManager

logger = logging.getLogger("leasing.heartbeat")

TIME = "time"
WORK = "work"
POLICIES = (TIME, WORK)


@dataclass(slots=True)
class KeptLease:
    """One lease a keeper keeps alive, and what it knows of its last renewal."""

    key: LeaseKey
    # A renewal extends the lease to now + `duration` (never past its deadline).
    duration: float
    # TIME: renew this often. WORK: at most this often, and only after a beat.
    period: float
    policy: str = TIME
    # The handler's beats; its age is recorded as progress with each renewal.
    progress: Heartbeat | None = None
    # When the lease was claimed or last renewed (monotonic).
    renewed_at: float = field(default_factory=time.monotonic)
    # The handler's beat count at that renewal (WORK: a new beat makes it due).
    beats_seen: int = 0

    @property
    def work_item_id(self) -> str:
        return self.key[0]


LostCallback = Callable[[KeptLease, BaseException], None]


class LeaseKeeper:
    """Renews the due leases of the `KeptLease`s it is shown, one statement a round."""

    def __init__(
        self,
        manager: LeaseManager,
        *,
        on_lost: LostCallback,
        max_failures: int | None = 3,
        renew_below: float = 1.0,
    ) -> None:
        self.manager = manager
        self.on_lost = on_lost
        # None: a failed round never counts a lease lost (the next one tries again).
        self.max_failures = max_failures
        # A lease with more than this fraction of its duration left keeps its
        # expiry and only records the heartbeat (an update that touches no
        # indexed column can be HOT).
        self.renew_below = renew_below
        self.consecutive_failures = 0
        self.rounds = 0

    def due(self, kept: KeptLease, now: float, slack: float = 0.0) -> bool:
        """Whether `kept` is due for a renewal at `now`.

        `slack`: how long until the driver looks again; a TIME lease whose
        period would run out before then is renewed now.
        """
        elapsed = now - kept.renewed_at
        if kept.policy == WORK:
            progress = kept.progress
            beat = progress is not None and progress.beats > kept.beats_seen
            return beat and elapsed >= kept.period
        return elapsed >= kept.period - slack

    def keep(
        self, kept: Sequence[KeptLease], *, slack: float = 0.0
    ) -> tuple[list[KeptLease], list[KeptLease]]:
        """One round: renew the due leases among `kept`; returns `(renewed, due)`.

        A due lease in neither list's first was lost or left alone: a lease
        whose row another transaction held at that moment is neither renewed
        nor lost, and the next round takes it.
        """
        now = time.monotonic()
        due = [k for k in kept if self.due(k, now, slack)]
        if not due:
            return [], []
        beats = [k.progress.beats if k.progress is not None else 0 for k in due]
        renewals = [
            Renewal(
                k.key[0],
                k.key[1],
                k.duration,
                k.duration * self.renew_below,
                k.progress.elapsed() if k.progress is not None and k.progress.beats else None,
            )
            for k in due
        ]
        started = time.monotonic()
        try:
            renewed, lost = self.manager.renew(renewals)
        except (DatabaseUnavailable, DatabaseError) as exc:
            self.failed(due, exc)
            return [], due
        self.consecutive_failures = 0
        self.rounds += 1
        kept_alive = []
        for k, seen in zip(due, beats, strict=True):
            if k.key in renewed:
                k.renewed_at = started
                k.beats_seen = seen
                kept_alive.append(k)
            elif k.key in lost:
                self._lose(k, self._refusal(k))
            else:
                self._skipped(k, started)
        return kept_alive, due

    def _refusal(self, kept: KeptLease) -> BaseException:
        """The specific error of a lease the database no longer shows as held."""
        try:
            return self.manager.refusal(kept.key[0], kept.key[1], renewing=True)
        except (DatabaseUnavailable, DatabaseError):
            return LeaseExpiredError(
                f"lease on {kept.key[0]} (token {kept.key[1]}) expired, reached its "
                "deadline or moved on"
            )

    def failed(self, due: Sequence[KeptLease], exc: BaseException) -> None:
        """A round the database failed: count it; past `max_failures`, `due` is lost."""
        self.consecutive_failures += 1
        limit = "" if self.max_failures is None else f"/{self.max_failures}"
        logger.warning("lease renewal failed (%d%s): %s", self.consecutive_failures, limit, exc)
        # A broken connection must not be reused for the next attempt.
        close_connection(self.manager.using)
        if self.max_failures is not None and self.consecutive_failures >= self.max_failures:
            for k in due:
                self._lose(k, exc)

    def _lose(self, kept: KeptLease, error: BaseException) -> None:
        try:
            self.on_lost(kept, error)
        except Exception:  # a broken callback must not stop the keeping of the others
            logger.exception("reporting the loss of the lease on %s failed", kept.key[0])

    def _skipped(self, kept: KeptLease, started: float) -> None:
        """A lease whose row another transaction held: say so once it is at risk.

        A completion being written holds it for milliseconds; a handler that
        keeps a transaction open around its own checkpoint holds it until that
        transaction ends, and the lease runs out meanwhile.
        """
        unrenewed = started - kept.renewed_at
        if unrenewed > kept.duration / 2:
            logger.warning(
                "lease on %s (token %d) not renewed for %.0f s: another transaction holds "
                "its row (a handler's transaction open around a checkpoint?); it runs out "
                "if that goes on",
                kept.key[0],
                kept.key[1],
                unrenewed,
            )


__all__ = ["POLICIES", "TIME", "WORK", "KeptLease", "LeaseKeeper"]
