"""How the admin names the operator actions."""

from __future__ import annotations

from ..services.operations import Action

ACTION_TEXT = {
    Action.FORCE_RELEASE: {
        "verb": "Force-release",
        "done": "force-released",
        "explain": (
            "Each lease is taken from its holder and the item goes back to pending "
            "(not counted as a retry), or ends cancelled if it had been asked to stop. The "
            "old holder's later renewals, checkpoints and release are refused by the fence."
        ),
    },
    Action.FORCE_FAIL: {
        "verb": "Force-fail",
        "done": "force-failed",
        "explain": "Each pending or leased item is failed for good; its lease is cleared.",
    },
    Action.RETRY: {
        "verb": "Retry",
        "done": "sent back to pending",
        "explain": (
            "Each failed or cancelled item goes back to pending with a fresh retry budget."
        ),
    },
    Action.CANCEL: {
        "verb": "Cancel",
        "done": "cancelled or asked to stop",
        "explain": (
            "Each pending item is cancelled at once. Each running item is asked to stop: its "
            "handler sees it within one heartbeat interval and its run ends cancelled (one "
            "that completes anyway completes). Dependents follow their dependency policy."
        ),
    },
    Action.DELETE: {
        "verb": "Delete",
        "done": "deleted",
        "explain": (
            "Each pending or finished item is deleted for good, with its checkpoints and "
            "dependency links; a record of the deletion (who, why, the item's status) stays "
            "on its task's checkpoint timeline and in the admin log. An item in progress is "
            "not deleted (cancel it), nor one that unfinished items still wait for."
        ),
    },
    Action.RUN_NOW: {
        "verb": "Run now",
        "done": "made due now",
        "explain": (
            "Each pending item waiting for a later time (a retry's backoff, a scheduled run) "
            "becomes due now, by the database's clock. A paused item still waits for its "
            "pause, and an item with dependencies for them."
        ),
    },
}
