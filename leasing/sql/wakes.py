"""Which idle worker answers a wake: the statements of `leasing.worker.leadership`.

PostgreSQL delivers a NOTIFY (`new_items.NOTIFY_CHANNEL`) to every session
that LISTENs on its channel. Had each worker answered with a claim, all but
the first would come back empty: at 100 enqueues a second with 4 workers,
three claims in four did nothing, and the workers spent twice the CPU and
transactions a job of one that listened alone. Worse, PostgreSQL signals every
session of the database that LISTENs on any channel for every NOTIFY, and
each reads the notification queue in a transaction of its own. So the workers
that claim the same items (one claim key) elect one to answer: the holder of
a session-level advisory lock on the key, taken on the listener's own
connection (a session, as LISTEN needs). Only the leader LISTENs, the others
try for the lead now and then; the lock goes with the session, so a dead
worker's lead passes to the next one that tries.
"""

from __future__ import annotations

from .runner import Statement

# Every statement of a listener's session starts with LISTEN or this mark, so
# monitoring (and the bench) can tell listener sessions apart.
LISTENER_MARK = "/* leasing listener */"
# In pg_stat_activity: a worker's listener session.
LISTENING = f"(left(query, 6) = 'LISTEN' OR starts_with(query, '{LISTENER_MARK}'))"
# The lead's advisory lock; its parameter is the claim key.
_LOCK_ID = "hashtextextended('leasing.wake:' || %s, 0)"


def try_lead(key: str) -> Statement:
    """Take the lead of `key` if nobody holds it; one row, one boolean."""
    return f"{LISTENER_MARK} SELECT pg_try_advisory_lock({_LOCK_ID})", [key]


def step_down(key: str) -> Statement:
    """Give up the lead of `key` (this session holds it)."""
    return f"{LISTENER_MARK} SELECT pg_advisory_unlock({_LOCK_ID})", [key]


def listen(channel: str, on: bool) -> str:
    """LISTEN (or UNLISTEN) `channel`, marked as a listener's statement. The
    channels are this package's constants, plain lower-case identifiers."""
    if not (channel.isidentifier() and channel.islower()):
        raise ValueError(f"not a channel name: {channel!r}")
    return f"{LISTENER_MARK} {'LISTEN' if on else 'UNLISTEN'} {channel}"
