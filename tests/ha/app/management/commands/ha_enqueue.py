"""`manage.py ha_enqueue`: enqueue the HA tests' items through the public API."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from leasing import enqueue_many
from tests.ha.app.handlers import LEDGER_DDL

BATCH = 2000


class Command(BaseCommand):
    help = "Create the ledger table and enqueue COUNT items of one work type."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--work-type", default="ha.effect")
        parser.add_argument("--count", type=int, required=True)
        parser.add_argument("--prefix", default="item")
        parser.add_argument("--input", default="{}", help="JSON input of every item.")
        parser.add_argument(
            "--checkpoint-every", type=int, default=0, help="Every Nth item also checkpoints."
        )
        parser.add_argument(
            "--effect-every",
            type=int,
            default=1,
            help="Every Nth item has a run_once effect (default: every item).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute(LEDGER_DDL)
        base = json.loads(options["input"])
        every = options["checkpoint_every"]
        effect_every = options["effect_every"]
        started = time.monotonic()
        specs = [
            {
                "task_id": f"{options['prefix']}-{index}",
                "work_type": options["work_type"],
                "input_data": {
                    **base,
                    "checkpoint": bool(every and index % every == 0),
                    "effect": bool(effect_every and index % effect_every == 0),
                },
            }
            for index in range(options["count"])
        ]
        for offset in range(0, len(specs), BATCH):
            enqueue_many(specs[offset : offset + BATCH])
        self.stdout.write(
            json.dumps({"enqueued": len(specs), "seconds": time.monotonic() - started})
        )
