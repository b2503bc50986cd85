"""`python manage.py seed_demo [--fresh] [--scenario PATH]`: load the demo data set.

The work is in `project.demo.seeding`; this command reads its options and
prints what was created.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS

from project.demo.seeding import DEFAULT_SCENARIO, load_scenario, seed


class Command(BaseCommand):
    help = (
        "Load the demo data set (fixtures/demo.json): work items in every status, checkpoints "
        "of every type, workers and a recovery sweep, relative to the database clock."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--fresh",
            action="store_true",
            help="Delete every row of the leasing tables (work items, checkpoints, "
            "idempotency keys, workers) first.",
        )
        parser.add_argument(
            "--scenario",
            default=str(DEFAULT_SCENARIO),
            help=f"Scenario file (default: {DEFAULT_SCENARIO}).",
        )
        parser.add_argument(
            "--database", default=DEFAULT_DB_ALIAS, help="Database alias (default: 'default')."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        scenario = load_scenario(options["scenario"])
        summary = seed(scenario, fresh=options["fresh"], using=options["database"])
        self.stdout.write(
            self.style.SUCCESS(f"Loaded the demo data set from {options['scenario']}:")
        )
        for line in summary.lines():
            self.stdout.write(f"  {line}")
