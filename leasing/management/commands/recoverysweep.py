"""`python manage.py recoverysweep`: the watchdog that recovers expired leases.

    manage.py recoverysweep                  # loop every LEASING["SWEEP_INTERVAL"] seconds
    manage.py recoverysweep --once --json    # one pass, stats as one JSON line
    manage.py recoverysweep --schedule       # run it from django-q2's qcluster instead

Several sweeps may run at once (on any hosts): they skip each other's rows.
A database that does not answer at start is waited for (about two minutes,
as `runworker` does), so a sweep started before PostgreSQL keeps its place.
SIGTERM or SIGINT finishes the current batch, marks the sweep's `workers` row
`stopped` and exits 0; a second signal exits at once.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from typing import Any

from django.apps import apps
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connections

from leasing import validation
from leasing.exceptions import DatabaseUnavailable, InvalidInput, ProcessIdInUse, one_line
from leasing.management.base import LeasingCommand
from leasing.sql.runner import until_reachable
from leasing.states import WorkerRole
from leasing.sweep import RecoveryStats, RecoverySweep, describe
from leasing.sweep.schedule import schedule_sweep
from leasing.threads import SignalThread

# How long a stopping sweep may take to finish its current batch.
STOP_TIMEOUT = 30.0

DJANGO_Q_SETUP = (
    "pip install 'django-leasing[schedule]', add \"django_q\" to INSTALLED_APPS "
    "(a Q_CLUSTER setting configures it), run manage.py migrate, then run manage.py qcluster"
)


def once_worker_id() -> str:
    """The id the `--once` passes of this host share."""
    return f"{WorkerRole.SWEEPER}@{socket.gethostname()}:once"


def require_django_q(using: str) -> None:
    """One line saying what to add when django-q2 is missing, not installed or not migrated."""
    if importlib.util.find_spec("django_q") is None:
        raise CommandError(f"--schedule needs django-q2, which is not installed: {DJANGO_Q_SETUP}.")
    if not apps.is_installed("django_q"):
        raise CommandError(f"--schedule needs django_q in INSTALLED_APPS: {DJANGO_Q_SETUP}.")
    from django_q.models import Schedule

    if using not in connections:
        raise CommandError(f"--database {using!r} is not in settings.DATABASES.")
    try:
        with connections[using].cursor() as cursor:
            tables = connections[using].introspection.table_names(cursor)
    except DatabaseError as exc:
        raise CommandError(f"cannot reach database {using!r}: {exc}".splitlines()[0]) from exc
    if Schedule._meta.db_table not in tables:
        raise CommandError(
            f"--schedule needs django-q2's tables, which database {using!r} lacks: "
            f"run manage.py migrate{'' if using == 'default' else f' --database {using}'}."
        )


class Command(LeasingCommand):
    help = (
        "Recover work items whose lease expired: re-queue them (retry N/M) or fail them "
        "once their retries are used up; prune old checkpoints, delete expired idempotency "
        "keys and mark silent workers lost."
    )

    removed_flags = {
        "--interval": "set LEASING['SWEEP_INTERVAL'].",
        "--retention": "set LEASING['CHECKPOINT_RETENTION'].",
        "--batch-size": "set LEASING['SWEEP_BATCH_SIZE'].",
        "--no-checkpoints": "the command always records each recovery; from Python, "
        "RecoverySweep(create_checkpoints=False).",
        "--no-cleanup": "set LEASING['CHECKPOINT_RETENTION'] to keep more checkpoints; from "
        "Python, RecoverySweep(cleanup_old_checkpoints=False).",
        "--worker-id": "the --once passes of a host share one id (sweeper@HOST:once); from "
        "Python, RecoverySweep(worker_id=...).",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once",
            action="store_true",
            help="Run one pass and exit: for cron, or a sweep run by hand after an incident.",
        )
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print each pass's stats as one JSON object, for a script or a monitor to read.",
        )
        parser.add_argument(
            "--schedule",
            action="store_true",
            help="Create or update the django-q2 schedule that runs one pass every "
            "LEASING['SWEEP_INTERVAL'] (rounded up to whole minutes) and exit, so a site that "
            "already runs qcluster needs no sweep process.",
        )
        parser.add_argument(
            "--database",
            default="default",
            help="The database alias to sweep, when the leasing tables live in another "
            "database than the default one.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with self.default_logging(options["verbosity"]):
            self._run(options)

    def _run(self, options: dict[str, Any]) -> None:
        self.verbosity = options["verbosity"]
        # Bad options are reported (in one line) before anything else is said.
        if options["schedule"] and options["once"]:
            raise CommandError("--schedule and --once cannot be combined.")
        try:  # as runworker's --database: the error names the flag
            options["database"] = validation.database_alias(options["database"], "--database")
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        if options["schedule"]:
            require_django_q(options["database"])
            self.run_leasing_checks()
            self._schedule(options)
            return
        try:
            sweep = RecoverySweep(
                using=options["database"],
                # One row in the workers table for all the --once passes of a host (cron),
                # not one per pass.
                worker_id=once_worker_id() if options["once"] else None,
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
            if not as_json and self.verbosity == 0:
                return
            line = json.dumps(stats.as_dict(), sort_keys=True) if as_json else describe(stats)
            with lock:
                self.stdout.write(line)
                self.stdout.flush()

        return emit

    def _run_until_signalled(self, sweep: RecoverySweep) -> None:
        stop = threading.Event()

        # A second signal gets the default behaviour: exit at once.
        signals = SignalThread(lambda _signum: stop.set(), second_is_default=True)
        signals.install()
        try:
            try:
                until_reachable(
                    sweep.start, what="starting the sweep", using=sweep.using, stop=stop
                )
            except (ProcessIdInUse, DatabaseUnavailable, DatabaseError) as exc:
                if stop.is_set():  # stopped while waiting for the database: nothing ran
                    return
                text = one_line(exc) if isinstance(exc, DatabaseError) else str(exc)
                raise CommandError(text) from exc
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
            signals.restore()

    def _schedule(self, options: dict[str, Any]) -> None:
        try:
            schedule, created = schedule_sweep(using=options["database"])
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        verb = "Created" if created else "Updated"
        self.stdout.write(
            f"{verb} django-q2 schedule {schedule.name!r} (id {schedule.pk}): "
            f"{schedule.func} every {schedule.minutes} minute(s). Run `manage.py qcluster`."
        )
