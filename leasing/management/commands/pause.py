"""`python manage.py pause --queue emails --reason "..."`: pause or resume a queue or work type.

With neither --queue nor --work-type, it lists the active pauses."""

from __future__ import annotations

import getpass
import os
from typing import Any

from django.core.management.base import CommandError, CommandParser

from leasing.exceptions import InvalidInput
from leasing.management.base import LeasingCommand, non_empty
from leasing.models import Pause
from leasing.services.pauses import pause, resume


def default_actor() -> str:
    """Who pauses, for the audit: the OS user (under sudo, the one who ran sudo)."""
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user:
        return f"{sudo_user} (sudo, manage.py pause)"
    try:
        return f"{getpass.getuser()} (manage.py pause)"
    except Exception:  # no user name in this environment
        return "manage.py pause"


class Command(LeasingCommand):
    help = (
        "Pause (or with --resume, resume) claims of one queue or one work type. Every worker "
        "skips a paused queue or work type from its next claim; items in flight finish and "
        "enqueues go on. With neither --queue nor --work-type it lists the active pauses."
    )

    removed_flags = {
        "--by": "the audit records the OS user running the command; from Python, "
        "leasing.pause(..., by=...).",
        "--list": "run `manage.py pause` with neither --queue nor --work-type.",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        which = parser.add_mutually_exclusive_group()
        which.add_argument(
            "--queue",
            type=non_empty,
            help="The queue to pause or resume: stop its claims during an outage of what its "
            "handlers call.",
        )
        which.add_argument(
            "--work-type",
            type=non_empty,
            help="The work type to pause or resume: stop a handler that misbehaves until a fix "
            "is deployed.",
        )
        parser.add_argument(
            "--resume",
            action="store_true",
            help="Resume instead of pausing: claims start again at the workers' next claim.",
        )
        parser.add_argument(
            "--reason",
            help="Why (required with --queue or --work-type): kept for the audit, shown in the "
            "console.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["queue"] is None and options["work_type"] is None:
            if options["resume"] or options["reason"]:
                raise CommandError(
                    "--resume and --reason need --queue or --work-type (alone, the command "
                    "lists the active pauses)."
                )
            self._list()
            return
        if options["reason"] is None:
            raise CommandError("--reason is required: say why, it is kept for the audit.")
        action = resume if options["resume"] else pause
        try:
            state = action(
                queue=options["queue"],
                work_type=options["work_type"],
                by=default_actor(),
                reason=options["reason"],
            )
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(state.describe())

    def _list(self) -> None:
        active = list(Pause.objects.active().order_by("kind", "name"))
        if not active:
            self.stdout.write("Nothing is paused.")
        for p in active:
            kind = p.get_kind_display().lower()
            when = f"{p.paused_at:%Y-%m-%d %H:%M:%S} UTC"
            self.stdout.write(f"{kind} {p.name!r}: paused {when} by {p.paused_by}: {p.reason}")
