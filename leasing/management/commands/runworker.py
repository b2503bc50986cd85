"""`python manage.py runworker`: a worker process."""

from __future__ import annotations

import gc
import sys
from typing import Any

from django.core.management.base import CommandError, CommandParser

from leasing import validation
from leasing.exceptions import InvalidInput, LeasingConfigurationError, ProcessIdInUse
from leasing.management.base import LeasingCommand, non_empty, positive_int
from leasing.worker import WorkerOptions, WorkerRuntime
from leasing.worker.runtime import EXIT_STATUSES

# Allocations between two collections of the young generation in a worker (Python's default: 700).
YOUNG_GENERATION_THRESHOLD = 10_000


class Command(LeasingCommand):
    help = (
        "Run a worker: claim work items under leases, run their handlers, release them. "
        "SIGTERM/SIGINT stop it gracefully; a second signal hands running items back and "
        "exits; past LEASING['MAX_ABANDONED_RUNS'] abandoned runs it exits with status 75. "
        "Lease terms, "
        "polling, prefetch and the shutdown timeout are LEASING settings, the same for every "
        "worker; the flags below are what differs from one worker process to the next."
    )

    removed_flags = {
        "--lease-seconds": "set LEASING['LEASE_DURATION'] (or a handler's lease_duration).",
        "--heartbeat-interval": (
            "set LEASING['HEARTBEAT_INTERVAL'] (or a handler's heartbeat_interval)."
        ),
        "--poll-interval": "set LEASING['POLL_INTERVAL'].",
        "--shutdown-timeout": "set LEASING['SHUTDOWN_TIMEOUT'].",
        "--prefetch": "set LEASING['PREFETCH'].",
        "--no-listen": "set LEASING['LISTEN'] = False.",
        "--task-id": "split work by --queue or --work-type.",
        "--summary-interval": "the worker logs a summary every minute.",
        "--json": "the final summary is the last line of the output.",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            metavar="N",
            help="Handler threads: size it to the host and the handlers (I/O-bound work "
            "takes many, CPU-bound work about one per core and process).",
        )
        parser.add_argument(
            "--queue",
            dest="queues",
            action="append",
            type=non_empty,
            default=[],
            metavar="NAME",
            help="Only claim items of this queue (repeatable), to give a queue workers of its "
            "own. Default: every queue.",
        )
        parser.add_argument(
            "--work-type",
            dest="work_types",
            action="append",
            type=non_empty,
            default=[],
            metavar="TYPE",
            help="Only claim this work type (repeatable), e.g. on the hosts that can run it. "
            "Default: every type with a handler.",
        )
        parser.add_argument(
            "--execution",
            choices=("thread", "process"),
            default="thread",
            help="Where handlers run, for types whose handler does not choose: 'thread' "
            "(default; I/O-bound work) or 'process', a child process per thread that the "
            "worker can stop at a timeout, a cancel or a lost lease (CPU-bound work, code "
            "that may hang). See docs/how-to/execution-modes.md.",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit when nothing is claimable and all is done: a batch job, or cron. Work "
            "due within a poll (a retry's short backoff) is waited for, and so is work a "
            "concurrency limit holds back behind this worker's own runs; work a pause holds "
            "back, behind a concurrency limit other processes fill, or behind a rate limit "
            "that opens later is left for the next run.",
        )
        parser.add_argument(
            "--max-items",
            type=positive_int,
            metavar="N",
            help="Exit after claiming this many items, so the service manager starts a fresh "
            "process (a handler that leaks memory).",
        )
        parser.add_argument(
            "--database",
            default="default",
            metavar="ALIAS",
            help="The database alias to claim work from, when it is not the default one: "
            "the alias a Tasks backend's OPTIONS['DATABASE'] names. Run recoverysweep with "
            "the same --database.",
        )
        parser.add_argument(
            "--worker-id",
            type=non_empty,
            metavar="ID",
            help="A fixed name for this process in the console and the workers table, e.g. "
            "the systemd instance, kept across restarts (a live process's id is refused). "
            "Default: hostname:pid:random.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with self.default_logging(options["verbosity"]):
            self._run(options)

    def _run(self, options: dict[str, Any]) -> None:
        try:
            # Validated as recoverysweep's --database: a typo is one line, before anything runs.
            using = validation.database_alias(options["database"], "--database")
            worker = WorkerRuntime(
                WorkerOptions(
                    concurrency=options["concurrency"],
                    work_types=tuple(options["work_types"]),
                    queues=tuple(options["queues"]),
                    max_items=options["max_items"],
                    burst=options["burst"],
                    worker_id=options["worker_id"],
                    execution=options["execution"],
                    using=using,
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
        # that live until its outcome is written: collecting the young
        # generation every 700 allocations (Python's default) took a visible
        # share of a fast item's client CPU (`make bench`). Collect it every
        # YOUNG_GENERATION_THRESHOLD instead.
        gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])
        worker.install_signal_handlers()
        try:
            summary = worker.run()
        except ProcessIdInUse as exc:
            raise CommandError(str(exc)) from exc
        finally:
            worker.restore_signal_handlers()
        if options["verbosity"] >= 1:
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
                    "cancelled",
                )
            )
            self.stdout.write(f"worker {summary.worker_id} stopped ({summary.reason}): {counts}")
        if summary.reason in EXIT_STATUSES:
            # Threads cannot be stopped or restarted, a process can: the service manager
            # starts a fresh one.
            sys.exit(EXIT_STATUSES[summary.reason])
