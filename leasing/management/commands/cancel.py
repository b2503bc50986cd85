"""`python manage.py cancel ID [ID ...] --reason "..."`: cancel work items.

A pending item is cancelled at once; a running one is asked to stop (its
handler sees it within one heartbeat interval and its run ends cancelled).
Each is audited like every operator action: a `state_transition` checkpoint
naming the OS user and the reason.
"""

from __future__ import annotations

import getpass
import os
from typing import Any

from django.core.management.base import CommandError, CommandParser

from leasing.exceptions import InvalidInput, WorkItemNotFound
from leasing.management.base import LeasingCommand, non_empty
from leasing.services.operations import cancel


def default_actor() -> str:
    """Who cancels, for the audit: the OS user (under sudo, the one who ran sudo)."""
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user:
        return f"{sudo_user} (sudo, manage.py cancel)"
    try:
        return f"{getpass.getuser()} (manage.py cancel)"
    except Exception:  # no user name in this environment
        return "manage.py cancel"


class Command(LeasingCommand):
    help = (
        "Cancel work items: a pending one at once, a running one asked to stop (its run ends "
        "cancelled once its handler sees the request, within one heartbeat interval). "
        "Prints what became of each; exits 1 if any could not be cancelled."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="+", type=non_empty, help="Work item ids.")
        parser.add_argument(
            "--reason",
            required=True,
            type=non_empty,
            help="Why: kept for the audit (the item's checkpoints) and shown in the console.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        actor = default_actor()
        refused = 0
        ids = list(dict.fromkeys(options["ids"]))  # an id given twice is cancelled once
        for item_id in ids:
            try:
                result = cancel(item_id, actor=actor, reason=options["reason"])
            except WorkItemNotFound:
                self.stderr.write(f"{item_id}: no such work item")
                refused += 1
                continue
            except InvalidInput as exc:  # this id (or the reason): the other ids still go
                self.stderr.write(f"{_shown(item_id)}: {exc}")
                refused += 1
                continue
            if result.applied:
                what = (
                    "cancelled"
                    if result.new_status == "cancelled"
                    else "asked to stop (it is running)"
                )
                self.stdout.write(f"{item_id}: {what}")
            else:
                self.stderr.write(f"{item_id}: {result.detail}")
                refused += 1
        if refused:
            raise CommandError(f"{refused} of {len(ids)} item(s) not cancelled.")


def _shown(text: str) -> str:
    """An argument as the terminal can print it (argv may carry undecodable bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return ascii(text)
    return text
