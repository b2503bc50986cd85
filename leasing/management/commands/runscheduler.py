"""`python manage.py runscheduler`: enqueue the ticks of the schedules.

    manage.py runscheduler                 # sync LEASING["SCHEDULES"], then a pass every second
    manage.py runscheduler --once          # sync and one pass, then exit (cron, tests)

Run one or several (on any hosts, for availability): each tick is enqueued
once whatever their number (a compare-and-swap of `next_run_at` plus a unique
key per tick, see `leasing.services.schedules`). A database that does not
answer at start is waited for (about two minutes, as `runworker` does).
SIGTERM or SIGINT finishes the current pass and exits 0; a second signal
exits at once.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from leasing.exceptions import DatabaseUnavailable, InvalidInput
from leasing.management.base import LeasingCommand
from leasing.services.schedules import PASS_INTERVAL, Fired, run_due, sync_from_settings
from leasing.sql.runner import close_connection, is_infrastructure_error, until_reachable
from leasing.threads import SignalThread

logger = logging.getLogger("leasing.schedules")


class Command(LeasingCommand):
    help = (
        "Enqueue one work item per tick of each enabled schedule (LEASING['SCHEDULES'] and "
        "the admin's Schedules). Several may run at once: each tick is enqueued once."
    )

    removed_flags = {
        "--interval": f"the scheduler makes a pass every {PASS_INTERVAL:g}s.",
        "--no-sync": "the scheduler always syncs LEASING['SCHEDULES'] first.",
        "--json": "each tick enqueued is one line of the output: schedule, tick -> item id.",
        "--database": "the scheduler uses the default database, as runworker does.",
    }

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--once",
            action="store_true",
            help="Sync the schedules, make one pass and exit: for cron instead of a "
            "long-running process.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with self.default_logging(options["verbosity"]):
            self._run(options)

    def _run(self, options: dict[str, Any]) -> None:
        using = DEFAULT_DB_ALIAS
        self.run_leasing_checks()
        if options["once"]:
            with self._clear_errors(using):
                self._sync(using)
                run_due(using=using, on_fired=self._report)
            return
        stop = threading.Event()
        # A second signal gets the default behaviour: exit at once.
        signals = SignalThread(lambda _signum: stop.set(), second_is_default=True)
        signals.install()
        try:
            try:
                with self._clear_errors(using):
                    # A database that does not answer yet is waited for, as runworker does.
                    sync = lambda: self._sync(using)  # noqa: E731
                    until_reachable(sync, what="syncing the schedules", using=using, stop=stop)
            except CommandError:
                if stop.is_set():  # stopped while waiting for the database: nothing ran
                    return
                raise
            self._loop(using, PASS_INTERVAL, stop)
        finally:
            signals.restore()

    @staticmethod
    def _sync(using: str) -> None:
        result = sync_from_settings(using=using)
        if result.removed:
            logger.info("schedules no longer in the settings removed: %s", result.removed)

    @staticmethod
    @contextlib.contextmanager
    def _clear_errors(using: str) -> Iterator[None]:
        """Bad schedules and an unreachable database as one-line command errors."""
        try:
            yield
        except InvalidInput as exc:
            raise CommandError(str(exc)) from exc
        except (DatabaseUnavailable, DatabaseError) as exc:
            raise CommandError(f"database {using!r}: {exc}".splitlines()[0]) from exc

    def _report(self, f: Fired) -> None:
        """One line per tick, written as soon as its item is enqueued: an outage later in
        the pass must not hide the items it did enqueue."""
        if self.verbosity_level <= 0:
            return
        line = f"{f.schedule} {f.tick.isoformat()} -> {f.work_item_id}"
        if f.ticks > 1:
            line += f" (stands for {f.ticks} ticks)"
        if f.duplicate:
            line += " (already enqueued)"
        self.stdout.write(line)
        self.stdout.flush()

    def _loop(self, using: str, interval: float, stop: threading.Event) -> None:
        logger.info("scheduler running a pass every %gs; SIGTERM or Ctrl-C stops it", interval)
        # A schedule that cannot enqueue is logged once, not once a pass (run_due).
        reported: set[tuple[str, str]] = set()
        while not stop.is_set():
            try:
                run_due(using=using, reported=reported, on_fired=self._report)
            except Exception as exc:
                if not is_infrastructure_error(exc):
                    raise
                # An outage or a lock conflict: the pass changed nothing; try again.
                logger.warning("scheduler pass failed, retrying: %s", exc)
                close_connection(using)
            stop.wait(interval)
        logger.info("scheduler stopped")

    def execute(self, *args: Any, **options: Any) -> Any:
        self.verbosity_level = options.get("verbosity", 1)
        return super().execute(*args, **options)
