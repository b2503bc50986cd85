"""One idle worker answers each wake: the worker side of `leasing.sql.wakes`.

The listener thread asks `Leadership` what to do with each NOTIFY it hears
and runs its statements on the listener's own connection (the advisory lock
is that session's); the dispatcher reports each claim (`claimed`).

PostgreSQL signals every session of a database that LISTENs on any channel
for every NOTIFY, and each such session reads the notification queue in a
transaction of its own. So only the leader LISTENs, and only while wakes are
worth hearing:

- Leading, wakes sparse: LISTEN; claim on each wake, unless the last claim
  took all it asked for (the process's room, or a `CLAIM_CHUNK` of it: either
  way items may be left) or it has no room now; then step down (the others
  take the lead in turn, and each claims as it does). Without a wake, a leader
  steps down once its claims have kept filling up for `FILLED_FOR_S`.
- Leading, wakes dense (two within `DENSE_WAKES_S`): UNLISTEN, and the
  dispatcher claims every `TRICKLE_POLL_S` on its own timer instead, until a
  claim gets fewer than `TRICKLE_LEAST_ITEMS` (enqueues no longer come faster
  than the claims); then LISTEN again and claim once more (an enqueue between
  that claim and the LISTEN is not missed). While enqueues come faster than
  claims, a claim every interval costs the same round trips with no
  notification to read.
- Not leading: no LISTEN at all; with room, try to take the lead every
  `LEAD_RETRY_S`, and claim when that worked (wakes went unheard meanwhile). A
  dead leader's lock goes with its session, so its wakes wait at most that
  long, and a leader that stepped down is followed as fast.

The listener waits for a NOTIFY, for its next try for the lead, or for the
dispatcher's nudge after a claim that changes what it should do (it filled
up, or came back sparse or without room while trickling): never on a timer
of its own while it leads, since on a busy host each wake-up costs about what
a small claim's items do.

Any worker still polls (`poll_interval`), so a wake nobody answered (a leader
whose dispatcher is stuck) waits at most one poll; while work is scarce, a
poll by a worker that does not lead takes only items older than
`dispatcher.POLL_SETTLED_S`, leaving the leader's to the leader.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from typing import Any

from ..services.terms import claim_limits
from ..sql import wakes
from ..sql.terms import ClaimFilters

# How often a worker that does not lead tries to take the lead (a statement each).
LEAD_RETRY_S = 0.5
# Two wakes closer than this (the dispatcher's cooldown between claims):
# enqueues come faster than a leader claims.
DENSE_WAKES_S = 0.025
# While they do, the leader stops listening and its dispatcher claims this often
# instead, timing the claims itself (its finished items wait as long for company:
# `LINGER_SECONDS`), so a trickle claim wakes the dispatcher and an executor only.
TRICKLE_POLL_S = 0.05
# A leader steps down once its claims have filled up for this long: a quick
# item's claim that took all it asked for (its room) is followed at once by
# another, which finds whether items were left.
FILLED_FOR_S = 0.05
# A trickling claim that gets fewer items than this: enqueues no longer come
# faster than the trickle claims, and a wake answered at once costs no more.
TRICKLE_LEAST_ITEMS = 2


def claim_key(filters: ClaimFilters) -> str:
    """Workers with the same key claim the same items: their filters and the limits
    those run into."""
    names = [None if v is None else sorted(v) for v in (filters.work_types, filters.queues)]
    described = repr((*names, filters.task_ids, claim_limits(filters)))
    return hashlib.sha256(described.encode()).hexdigest()[:16]


class Leadership:
    """This worker's part in electing the one that answers wakes for its claim key."""

    def __init__(self, key: str, has_room: Callable[[], bool]) -> None:
        self.key = key
        self.has_room = has_room
        # Ends the listener's wait at once (set by the listener; called by the dispatcher).
        self.nudge: Callable[[], None] = lambda: None
        self.leading = False  # read and written by the listener thread only
        # Leading without listening, the dispatcher claiming every TRICKLE_POLL_S
        # (written by the listener thread only).
        self.trickle = False
        # The last claim took all it asked for / got less than TRICKLE_LEAST_ITEMS
        # (set by the dispatcher, read by the listener).
        self._filled = False
        self._filled_at = 0.0  # monotonic time of the first of the claims that filled up
        self._sparse = False
        self._next_try = 0.0  # monotonic time of the next try for the lead
        self._last_wake = 0.0  # monotonic time of the last wake heard
        self._claimed_at = 0.0  # monotonic time the dispatcher's last round trip started

    @property
    def listens(self) -> bool:
        """Whether the listener should LISTEN on the enqueue channel now."""
        return self.leading and not self.trickle

    # --- the dispatcher -----------------------------------------------------------------

    def claimed(self, asked: int, got: int, started_at: float) -> None:
        """A round trip started at `started_at` (monotonic) asked for `asked` items (0: no
        room, or only completions) and got `got`. The listener is nudged when that changes
        what it should do: step down after a claim that filled up; while trickling, listen
        again after a sparse claim, or step down without room."""
        self._claimed_at = started_at  # the trickle's claims start TRICKLE_POLL_S apart
        newly_filled = False
        if asked > 0:
            newly_filled = got >= asked and not self._filled
            if newly_filled:
                self._filled_at = started_at
            self._filled = got >= asked
            self._sparse = got < TRICKLE_LEAST_ITEMS
        if self.leading and (newly_filled or (self.trickle and (self._sparse or asked == 0))):
            self.nudge()

    def trickle_due_in(self) -> float:
        """Seconds until the dispatcher's next claim of the trickle (inf: not trickling)."""
        if not self.trickle:
            return math.inf
        return self._claimed_at + TRICKLE_POLL_S - time.monotonic()

    # --- the listener thread ------------------------------------------------------------

    def wait_s(self, idle_wait_s: float) -> float:
        """How long the listener may wait for a NOTIFY (or a nudge)."""
        if self.leading:
            if self._filled:  # till it steps down, unless a claim with room comes first
                return max(0.0, self._filled_at + FILLED_FOR_S - time.monotonic())
            return idle_wait_s
        return min(idle_wait_s, max(0.0, self._next_try - time.monotonic()))

    def woken(self, conn: Any) -> bool:
        """A wake for this worker's queues: whether this worker claims for it."""
        if not self.leading:
            return False  # heard just before its UNLISTEN: nothing to answer
        if self._filled or not self.has_room():
            self._step_down(conn)
            return False
        now = time.monotonic()
        if now - self._last_wake < DENSE_WAKES_S:
            self.trickle = True  # the listener UNLISTENs; the dispatcher times the claims
            self._sparse = False
        self._last_wake = now
        return True

    def tick(self, conn: Any) -> bool:
        """Between waits: a leader whose claims kept filling up steps down; a trickling
        leader steps down without room, and listens again (and claims) after a sparse
        claim; a worker that does not lead tries for the lead when its time comes.
        Whether this worker claims now."""
        now = time.monotonic()
        if self.leading:
            filled = self._filled and now - self._filled_at >= FILLED_FOR_S
            if filled or (self.trickle and not self.has_room()):
                self._step_down(conn)
                return False
            if not self.trickle:
                return False
            if self._sparse:
                self.trickle = False  # the listener LISTENs before the claim this asks for
                self._sparse = False
                return True
            return False
        if now < self._next_try:
            return False
        if not self.has_room():
            self._next_try = now + LEAD_RETRY_S
            return False
        return self._try_lead(conn)

    def disconnected(self) -> None:
        """The listener's session ended, and its lock with it."""
        self.leading = self.trickle = False

    def _try_lead(self, conn: Any) -> bool:
        sql, params = wakes.try_lead(self.key)
        self.leading = bool(conn.execute(sql, params).fetchone()[0])
        if self.leading:
            self._filled = self._sparse = False
        else:
            self._next_try = time.monotonic() + LEAD_RETRY_S
        return self.leading

    def _step_down(self, conn: Any) -> None:
        sql, params = wakes.step_down(self.key)
        conn.execute(sql, params)
        self.leading = self.trickle = False
        self._filled = False
        self._next_try = time.monotonic() + LEAD_RETRY_S  # the others take it first
