"""Which idle worker answers a wake: the statements of `leasing.worker.leadership`.

Every listening worker hears every NOTIFY (`new_items.NOTIFY_CHANNEL`). Had
each answered with a claim, all but the first would come back empty: at 100
enqueues a second with 4 workers, three claims in four did nothing, and the
workers spent twice the CPU and transactions a job of one that listened
alone. So the workers that claim the same items (one claim key) elect one
to answer: the holder of a session-level advisory lock on the key, taken on
the listener's own connection (a session, as LISTEN needs). The lock goes
with the session, so a dead worker's lead passes to the next one woken.

A leader whose claim took all it had room for may have left items behind:
it steps down and sends `HANDOFF_CHANNEL` (`key sender`), which every other
worker with the key answers with a claim.
"""

from __future__ import annotations

from .runner import Statement

HANDOFF_CHANNEL = "leasing_handoff"
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


def hand_off(key: str, sender: str) -> Statement:
    """Wake the other workers of `key`: the leader's claim left items behind."""
    return f"{LISTENER_MARK} SELECT pg_notify(%s, %s)", [HANDOFF_CHANNEL, f"{key} {sender}"]
