"""`python manage.py recoverysweep`: the watchdog that recovers expired leases.

    manage.py recoverysweep                  # loop every LEASING["SWEEP_INTERVAL"] seconds
    manage.py recoverysweep --once --json    # one pass, stats as one JSON line
    manage.py recoverysweep --schedule       # run it from django-q2's qcluster instead

Several sweeps may run at once (on any hosts): they skip each other's rows.
SIGTERM or SIGINT finishes the current batch, marks the sweep's `workers` row
`stopped` and exits 0; a second signal exits at once.
"""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

from django.core.management.base import CommandError, CommandParser

from leasing.exceptions import DatabaseUnavailable, InvalidInput, ProcessIdInUse
from leasing.management.base import LeasingCommand, positive_float, positive_int
from leasing.sweep import RecoveryStats, RecoverySweep, describe
from leasing.sweep.schedule import schedule_sweep

# How long a stopping sweep may take to finish its current batch.
STOP_TIMEOUT = 30.0


class Command(LeasingCommand):
    help = (
        "Recover work items whose lease expired: re-queue them (retry N/M) or fail them "
        "once their retries are used up; prune old checkpoints, delete expired idempotency "
        "keys and mark silent workers lost."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Run one pass and exit.")
        parser.add_argument(
            "--interval",
            type=positive_float,
            metavar="S",
            help="Seconds between passes (default: LEASING['SWEEP_INTERVAL'], 60).",
        )
        parser.add_argument(
            "--retention",
            type=positive_int,
            metavar="N",
            help="Checkpoints kept per task (default: LEASING['CHECKPOINT_RETENTION'], 100).",
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            metavar="N",
            help="Items recovered per transaction (default: LEASING['SWEEP_BATCH_SIZE'], 2000).",
        )
        parser.add_argument(
            "--no-checkpoints",
            action="store_true",
            help="Do not write an error_boundary checkpoint per recovered item.",
        )
        parser.add_argument(
            "--no-cleanup",
            action="store_true",
            help="Do not prune checkpoints beyond the retention limit.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print each pass's stats as one JSON object."
        )
        parser.add_argument(
            "--schedule",
            action="store_true",
            help=(
                "Create or update the django-q2 schedule that runs one pass every --interval "
                "(rounded up to whole minutes) and exit; qcluster then does the sweeping."
            ),
        )
        parser.add_argument(
            "--worker-id", help="The sweep's id in the workers table (default: generated)."
        )
        parser.add_argument("--database", default="default", help="Database alias to sweep.")

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity = options["verbosity"]
        # Bad options are reported (in one line) before anything else is said.
        if options["schedule"] and options["once"]:
            raise CommandError("--schedule and --once cannot be combined.")
        if options["schedule"]:
            self.run_leasing_checks()
            self._schedule(options)
            return
        try:
            sweep = RecoverySweep(
                scan_interval_seconds=options["interval"],
                create_checkpoints=not options["no_checkpoints"],
                cleanup_old_checkpoints=not options["no_cleanup"],
                checkpoint_retention_limit=options["retention"],
                using=options["database"],
                batch_size=options["batch_size"],
                worker_id=options["worker_id"],
                on_scan=self._printer(options["json"]),
            )
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        self.run_leasing_checks()
        if options["once"]:
            stats = sweep.scan_and_recover()
            if stats.errors:
                raise CommandError(f"the pass had {stats.errors} error(s); see the log above.")
            return
        self._run_until_signalled(sweep)

    def _printer(self, as_json: bool) -> Any:
        lock = threading.Lock()

        def emit(stats: RecoveryStats) -> None:
            line = json.dumps(stats.as_dict(), sort_keys=True) if as_json else describe(stats)
            with lock:
                self.stdout.write(line)
                self.stdout.flush()

        return emit

    def _run_until_signalled(self, sweep: RecoverySweep) -> None:
        stop = threading.Event()

        def on_signal(signum: int, frame: Any) -> None:
            # A second signal gets the default behaviour: exit at once.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            stop.set()

        previous = {
            signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            try:
                sweep.start()
            except (ProcessIdInUse, DatabaseUnavailable) as exc:
                raise CommandError(str(exc)) from exc
            if self.verbosity > 0:
                self.stderr.write(
                    f"recovery sweep {sweep.worker_id} running every "
                    f"{sweep.scan_interval_seconds:g}s; SIGTERM or Ctrl-C stops it"
                )
            while not stop.wait(0.5):
                if not sweep.is_running():
                    raise CommandError("the sweep thread ended unexpectedly; see the log.")
            if not sweep.stop(wait=True, timeout=STOP_TIMEOUT):
                raise CommandError(f"the sweep did not stop within {STOP_TIMEOUT:g}s.")
            if self.verbosity > 0:
                self.stderr.write(f"recovery sweep {sweep.worker_id} stopped")
        finally:
            sweep.stop(wait=False)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _schedule(self, options: dict[str, Any]) -> None:
        try:
            schedule, created = schedule_sweep(
                interval_seconds=options["interval"],
                retention=options["retention"],
                create_checkpoints=not options["no_checkpoints"],
                cleanup_old_checkpoints=not options["no_cleanup"],
                using=options["database"],
            )
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        verb = "Created" if created else "Updated"
        self.stdout.write(
            f"{verb} django-q2 schedule {schedule.name!r} (id {schedule.pk}): "
            f"{schedule.func} every {schedule.minutes} minute(s). Run `manage.py qcluster`."
        )
