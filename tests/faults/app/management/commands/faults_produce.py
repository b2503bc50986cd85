"""`manage.py faults_produce --seconds S`: enqueue the fault run's workload for S seconds.

A batch every half second through the public API (`enqueue_many`, `enqueue`
with dependencies). A batch that meets a database fault is dropped and the
next one goes on: if its commit went through unacknowledged, its items exist
and are checked like any other. Prints one JSON line of counts at the end.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone

from leasing import enqueue, enqueue_many
from leasing.exceptions import LeasingError
from tests.faults.workload import batch, dependency_group

logger = logging.getLogger("leasing.faults")
INTERVAL = 0.5


class Command(BaseCommand):
    help = "Enqueue the fault run's workload for a number of seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, required=True)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--start", type=int, default=0, help="The first batch's number.")

    def handle(self, *args: Any, **options: Any) -> None:
        rng = random.Random(options["seed"])
        deadline = time.monotonic() + options["seconds"]
        self.until = timezone.now() + timedelta(seconds=options["seconds"])
        counts: Counter[str] = Counter()
        number = options["start"]
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                self.produce(number, rng, counts)
            except (DatabaseError, LeasingError) as exc:
                counts["batches_dropped"] += 1
                logger.warning("batch %d dropped: %s", number, str(exc).splitlines()[0])
                connection.close()
            close_old_connections()
            number += 1
            time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))
        self.stdout.write(json.dumps({"batches": number - options["start"], **counts}))

    def produce(self, number: int, rng: random.Random, counts: Counter[str]) -> None:
        specs = batch(number, rng, timezone.now(), self.until)
        enqueue_many(specs)
        counts["items"] += len(specs)
        if number % 2 == 0:
            parent_spec, children = dependency_group(number)
            parent = enqueue(**parent_spec)
            counts["items"] += 1
            for child in children:
                enqueue(**child, depends_on=[parent.work_item_id])
                counts["items"] += 1
