"""`python manage.py purgeitems --older-than 30d`: delete old finished work items."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError, CommandParser

from leasing.exceptions import InvalidInput
from leasing.management.base import LeasingCommand
from leasing.services.retention import FINISHED, parse_age, purge_finished_items

# Plain strings: argparse shows the choices by repr(), and an enum member's
# ("WorkItemStatus.COMPLETED") is not what the option takes.
STATUSES = [str(status.value) for status in FINISHED]


def age(text: str) -> Any:
    try:
        return parse_age(text)
    except InvalidInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(LeasingCommand):
    help = (
        "Delete completed, failed and cancelled work items finished longer ago than "
        "--older-than, with their checkpoints, in short batches. An item whose checkpoint "
        "an unfinished item of its task would resume from is kept until that one finishes."
    )

    removed_flags = {
        "--batch-size": "each transaction deletes at most 5000 rows; from Python, "
        "leasing.services.retention.purge_finished_items(batch_size=...).",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=age,
            required=True,
            help="Age of finished items to delete: 30d, 12h, 90m, 45s, 2w. How long finished "
            "items stay visible in the console and to dependents.",
        )
        parser.add_argument(
            "--status",
            dest="statuses",
            action="append",
            choices=STATUSES,
            help="Only this status (repeatable), e.g. keep failed items longer than completed "
            "ones. Default: all three (completed, failed and cancelled).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Count what would be deleted and delete nothing: check a retention rule "
            "before cron runs it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            stats = purge_finished_items(
                options["older_than"],
                statuses=options["statuses"] or STATUSES,
                dry_run=options["dry_run"],
            )
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        verb = "would delete" if stats.dry_run else "deleted"
        self.stdout.write(
            f"{verb} {stats.items_deleted} finished work item(s) in {stats.duration_ms:.0f} ms"
        )
