"""`python manage.py runworker`: a worker process."""

from __future__ import annotations

import dataclasses
import gc
import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from leasing.exceptions import InvalidInput, LeasingConfigurationError, ProcessIdInUse
from leasing.management.base import (
    LeasingCommand,
    non_empty,
    non_negative_int,
    positive_float,
    positive_int,
)
from leasing.worker import WorkerOptions, WorkerRuntime

# Allocations between two collections of the young generation in a worker (Python's default: 700).
YOUNG_GENERATION_THRESHOLD = 10_000


class Command(LeasingCommand):
    help = (
        "Run a worker: claim work items under leases, run their handlers, release them. "
        "SIGTERM/SIGINT stop it gracefully; a second signal exits at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency", type=positive_int, default=1, help="Handler threads (default 1)."
        )
        parser.add_argument(
            "--work-type",
            dest="work_types",
            action="append",
            type=non_empty,
            default=[],
            metavar="TYPE",
            help="Only claim this work type (repeatable). Default: every type with a handler.",
        )
        parser.add_argument("--task-id", type=non_empty, help="Only claim items of this task.")
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=non_empty,
            default=[],
            metavar="NAME",
            help="Only claim items of this queue (repeatable). Default: every queue.",
        )
        parser.add_argument(
            "--lease-seconds", type=positive_float, help="Lease duration (LEASE_DURATION)."
        )
        parser.add_argument(
            "--heartbeat-interval",
            type=positive_float,
            help="Seconds between lease renewals (HEARTBEAT_INTERVAL); below the lease.",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_float,
            help="Seconds between claims when idle, +/-20%% jitter (POLL_INTERVAL).",
        )
        parser.add_argument(
            "--max-items", type=positive_int, help="Exit after claiming this many items."
        )
        parser.add_argument(
            "--burst", action="store_true", help="Exit when nothing is claimable and all is done."
        )
        parser.add_argument("--worker-id", type=non_empty, help="Default: hostname:pid:random.")
        parser.add_argument(
            "--shutdown-timeout",
            type=positive_float,
            help="Seconds running items get to finish after SIGTERM (SHUTDOWN_TIMEOUT).",
        )
        parser.add_argument(
            "--prefetch",
            type=non_negative_int,
            help="Items to claim ahead of free threads. Default: adaptive (fast handlers only).",
        )
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help="Poll only; do not wait for PostgreSQL NOTIFY on enqueue.",
        )
        parser.add_argument(
            "--summary-interval",
            type=positive_float,
            default=60.0,
            help="Seconds between summary log lines (default 60).",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the final summary as one JSON line."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with self.default_logging(options["verbosity"]):
            self._run(options)

    def _run(self, options: dict[str, Any]) -> None:
        try:
            worker = WorkerRuntime(
                WorkerOptions(
                    concurrency=options["concurrency"],
                    work_types=tuple(options["work_types"]),
                    task_id=options["task_id"],
                    queues=tuple(options["queues"]),
                    lease_seconds=options["lease_seconds"],
                    heartbeat_interval=options["heartbeat_interval"],
                    poll_interval=options["poll_interval"],
                    max_items=options["max_items"],
                    burst=options["burst"],
                    worker_id=options["worker_id"],
                    shutdown_timeout=options["shutdown_timeout"],
                    prefetch=options["prefetch"],
                    summary_interval=options["summary_interval"],
                    listen=not options["no_listen"],
                )
            )
        except (InvalidInput, LeasingConfigurationError) as exc:
            raise CommandError(str(exc)) from exc
        self.run_leasing_checks()
        # What start-up loaded (Django, the app registry, handlers) lives as
        # long as the process: keep it out of the collector's full passes,
        # which a busy worker's many short-lived objects would otherwise
        # trigger over and over.
        gc.freeze()
        # A claimed batch makes a few objects per item (lease, slot, context)
        # that live until its outcome is written: with the young generation
        # collected every 700 allocations (the default), a no-op item paid
        # about a microsecond of collection (about 10% of its client CPU,
        # `make bench`). Collect it every YOUNG_GENERATION_THRESHOLD instead.
        gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])
        worker.install_signal_handlers()
        try:
            summary = worker.run()
        except ProcessIdInUse as exc:
            raise CommandError(str(exc)) from exc
        finally:
            worker.restore_signal_handlers()
        if options["json"]:
            self.stdout.write(json.dumps(dataclasses.asdict(summary)))
        elif options["verbosity"] >= 1:
            counts = ", ".join(
                f"{name} {getattr(summary, name)}"
                for name in (
                    "claimed",
                    "completed",
                    "failed",
                    "retried",
                    "interrupted",
                    "timed_out",
                    "lost",
                    "requeued",
                )
            )
            self.stdout.write(f"worker {summary.worker_id} stopped ({summary.reason}): {counts}")
