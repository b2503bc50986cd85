"""One idle worker answers each wake: the worker side of `leasing.sql.wakes`.

The listener thread asks `Leadership` what to do with each NOTIFY it hears
and runs its statements on the listener's own connection (the advisory lock
is that session's); the dispatcher reports each claim (`claimed`).

- A wake, leading: claim, unless the last claim took all it asked for (the
  process's room, or a `CLAIM_CHUNK` of it: either way items may be left) or it
  has no room now; then step down and hand off (the others claim).
- A wake, not leading: with room, try to take the lead; claim if that worked.
  After a failed try a worker waits `LEAD_RETRY_S` before the next (a
  statement per wake per worker would cost more than the claims it saves);
  a wake that came meanwhile is owed a try when the wait ends, so a dead
  leader's wakes wait at most that long.
- A handoff from another worker of the key: claim if there is room (and take
  the lead if it is free).

Any worker still polls (`poll_interval`), so a wake nobody answered (a leader
whose dispatcher is stuck) waits at most one poll.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any

from ..services.terms import claim_limits
from ..sql import wakes
from ..sql.terms import ClaimFilters

# How long a leader's listener waits for a NOTIFY before looking whether its
# last claim filled up (and it should hand off).
LEADER_WAIT_S = 0.02
# After failing to take the lead, how long a worker waits before trying again.
LEAD_RETRY_S = 0.1


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
        self.sender = secrets.token_hex(6)
        self.has_room = has_room
        self.leading = False  # read and written by the listener thread only
        # The last claim took all it asked for (set by the dispatcher, read by the listener).
        self._filled = False
        self._next_try = 0.0  # monotonic time of the next try for the lead
        self._owed = False  # a wake came while waiting for it

    # --- the dispatcher -----------------------------------------------------------------

    def claimed(self, asked: int, got: int) -> None:
        """A claim asked for `asked` items and got `got`."""
        if asked > 0:
            self._filled = got >= asked

    # --- the listener thread ------------------------------------------------------------

    def wait_s(self, idle_wait_s: float) -> float:
        if self.leading:
            return LEADER_WAIT_S
        if self._owed:
            return min(idle_wait_s, max(0.0, self._next_try - time.monotonic()))
        return idle_wait_s

    def woken(self, conn: Any) -> bool:
        """A wake for this worker's queues: whether this worker claims for it."""
        if self.leading:
            if self._filled or not self.has_room():
                self._step_down(conn)
                return False
            return True
        if not self.has_room():
            return False
        if time.monotonic() < self._next_try:
            self._owed = True
            return False
        return self._try_lead(conn)

    def handed_off(self, conn: Any, payload: str) -> bool:
        """A handoff: whether this worker claims for it."""
        key, _, sender = payload.partition(" ")
        if key != self.key or sender == self.sender or not self.has_room():
            return False
        if not self.leading:
            self._try_lead(conn)
        return True

    def tick(self, conn: Any) -> bool:
        """Between waits: a leader whose last claim filled up hands off; a worker owed a
        try for the lead tries. Whether this worker claims now."""
        if self.leading and self._filled:
            self._step_down(conn)
        elif self._owed and time.monotonic() >= self._next_try:
            return self.has_room() and self._try_lead(conn)
        return False

    def disconnected(self) -> None:
        """The listener's session ended, and its lock with it."""
        self.leading = False

    def _try_lead(self, conn: Any) -> bool:
        sql, params = wakes.try_lead(self.key)
        self.leading = bool(conn.execute(sql, params).fetchone()[0])
        self._owed = False
        if self.leading:
            self._filled = False
        else:
            self._next_try = time.monotonic() + LEAD_RETRY_S
        return self.leading

    def _step_down(self, conn: Any) -> None:
        for sql, params in (wakes.step_down(self.key), wakes.hand_off(self.key, self.sender)):
            conn.execute(sql, params)
        self.leading = False
        self._filled = False
