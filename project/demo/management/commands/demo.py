"""`python manage.py demo`: the whole system on one machine (what `make demo` runs).

1. migrates the database (SQLite by default);
2. loads the demo data set of `fixtures/demo.json` (every status, every
   checkpoint type, expired leases, retries) through `seed_demo`;
3. enqueues fresh items for the demo handlers and runs a worker over them,
   printing what happened to each;
4. unless `--no-serve`: creates a demo superuser, starts the dashboard
   (`runserver`), a worker and the recovery sweep as child processes, prints
   the URL and the credentials, and stops them all on Ctrl-C. The sweep starts
   `--expired-for` seconds later (60), so the expired lease of the data set
   stays on the dashboard for a while before the sweep recovers it. A child
   that exits (killed, crashed) is restarted, and the demo says so
   (`project/demo/supervisor.py`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError, CommandParser

from leasing import enqueue_many
from leasing.models import WorkItem
from leasing.worker import WorkerOptions, WorkerRuntime
from project.demo.supervisor import Child, Supervisor

DEMO_USER = "demo"
DEMO_PASSWORD = "leasing-demo"
EXPIRED_FOR = 60.0  # seconds the expired lease stays on the dashboard before the sweep starts

SAMPLE_ITEMS = [
    {"task_id": "demo-sleep-1", "work_type": "demo.sleep", "input_data": {"seconds": 0.5}},
    {"task_id": "demo-sleep-2", "work_type": "demo.sleep", "input_data": {"seconds": 0.2}},
    {"task_id": "demo-flaky-1", "work_type": "demo.flaky", "input_data": {"fail_times": 2}},
    {"task_id": "demo-flaky-2", "work_type": "demo.flaky", "input_data": {"permanent": True}},
    {
        "task_id": "demo-crunch-1",
        "work_type": "demo.crunch",
        "input_data": {"numbers": [3, 1, 4, 1, 5, 9, 2, 6]},
    },
]


class Command(BaseCommand):
    help = "Run the Leasing demo: data, a worker pass, then dashboard + worker + sweep."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--no-serve",
            action="store_true",
            help="Stop after the worker pass (no dashboard, worker or sweep processes).",
        )
        parser.add_argument("--port", type=int, default=8000, help="Dashboard port (8000).")
        parser.add_argument(
            "--expired-for",
            type=float,
            default=EXPIRED_FOR,
            metavar="S",
            help=(
                "Start the recovery sweep S seconds after the dashboard, so the expired "
                f"lease stays visible until then (default {EXPIRED_FOR:g}; 0: at once)."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.stdout.write(self.style.MIGRATE_HEADING("1. Database"))
        call_command("migrate", verbosity=0)
        self.stdout.write(f"   migrated {settings.DATABASES['default']['NAME']}")

        if "seed_demo" in get_commands():
            self.stdout.write(self.style.MIGRATE_HEADING("2. Demo data set (fixtures/demo.json)"))
            call_command("seed_demo", "--fresh", stdout=self.stdout)

        self.stdout.write(self.style.MIGRATE_HEADING("3. A worker over fresh sample items"))
        items = enqueue_many(SAMPLE_ITEMS)
        ids = [item.pk for item in items]
        worker = WorkerRuntime(
            WorkerOptions(
                concurrency=2,
                poll_interval=0.2,
                work_types=("demo.sleep", "demo.flaky", "demo.crunch"),
            )
        )
        runner = threading.Thread(target=worker.run, name="demo-worker")
        runner.start()
        # The flaky item retries with exponential backoff (about 2 s, then 4 s).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (
                not WorkItem.objects.filter(pk__in=ids)
                .exclude(status__in=["completed", "failed"])
                .exists()
            ):
                break
            time.sleep(0.2)
        worker.stop()
        runner.join()
        summary = worker.summary("done")
        self._print_items(ids)
        self.stdout.write(
            f"   worker {summary.worker_id}: completed {summary.completed}, "
            f"failed {summary.failed}, retried {summary.retried}"
        )
        if options["no_serve"]:
            return
        if options["expired_for"] < 0:
            raise CommandError("--expired-for must be 0 or more seconds.")
        self._serve(options["port"], options["expired_for"])

    def _print_items(self, ids: list[str]) -> None:
        rows = WorkItem.objects.filter(pk__in=ids).order_by("task_id")
        for row in rows:
            result = row.output_data if row.status == "completed" else row.error_message
            self.stdout.write(
                f"   {row.task_id:<14} {row.work_type:<12} {row.status:<10} "
                f"retries {row.retry_count}/{row.max_retries}  {result}"
            )

    def _serve(self, port: int, expired_for: float) -> None:
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(DEMO_PASSWORD)
        user.save()

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.stdout.write(self.style.MIGRATE_HEADING("4. Dashboard, worker and sweep running"))
        self.stdout.write(f"   dashboard: http://127.0.0.1:{port}/admin/")
        self.stdout.write(f"   user: {DEMO_USER}   password: {DEMO_PASSWORD}")
        expired = list(WorkItem.objects.expired().values_list("task_id", flat=True)[:3])
        if expired and expired_for > 0:
            self.stdout.write(
                f"   expired lease awaiting the sweep: {', '.join(expired)} (tile "
                f"“Expired, awaiting sweep”); the sweep recovers it {expired_for:g} s from now"
            )
        self.stdout.write("   Ctrl-C stops everything; a child that exits is restarted.")
        supervisor = Supervisor(demo_children(port, expired_for), self.stdout.write, env=env)
        supervisor.run()


def demo_children(port: int, expired_for: float) -> list[Child]:
    """The dashboard and a worker at once; the recovery sweep `expired_for` seconds later."""
    manage = [sys.executable, "manage.py"]
    children = [
        Child("dashboard", [*manage, "runserver", f"127.0.0.1:{port}", "--noreload"]),
        Child("worker", [*manage, "runworker", "--concurrency", "2"]),
    ]
    if "recoverysweep" in get_commands():
        # Its first pass, as it starts, recovers the expired lease.
        sweep = [*manage, "recoverysweep"]
        children.append(Child("recovery sweep", sweep, start_after=expired_for))
    return children
