"""`python manage.py demo`: the whole system on one machine (what `make demo` runs).

1. migrates the database (SQLite by default);
2. loads the demo data set of `fixtures/demo.json` (every status, every
   checkpoint type, expired leases, retries) through `seed_demo`;
3. enqueues fresh items for the demo handlers and runs a worker over them,
   printing what happened to each;
4. unless `--no-serve`: creates a demo superuser, starts the dashboard
   (`runserver`), a worker and the recovery sweep as child processes, prints
   the URL and the credentials, and stops them all on Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandParser

from leasing import enqueue_many
from leasing.models import WorkItem
from leasing.worker import WorkerOptions, WorkerRuntime

DEMO_USER = "demo"
DEMO_PASSWORD = "leasing-demo"

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
        self._serve(options["port"])

    def _print_items(self, ids: list[str]) -> None:
        rows = WorkItem.objects.filter(pk__in=ids).order_by("task_id")
        for row in rows:
            result = row.output_data if row.status == "completed" else row.error_message
            self.stdout.write(
                f"   {row.task_id:<14} {row.work_type:<12} {row.status:<10} "
                f"retries {row.retry_count}/{row.max_retries}  {result}"
            )

    def _serve(self, port: int) -> None:
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        user.is_staff = user.is_superuser = True
        user.set_password(DEMO_PASSWORD)
        user.save()

        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        manage = [sys.executable, "manage.py"]
        children = [
            subprocess.Popen([*manage, "runserver", f"127.0.0.1:{port}", "--noreload"], env=env),
            subprocess.Popen([*manage, "runworker", "--concurrency", "2"], env=env),
        ]
        if "recoverysweep" in get_commands():
            children.append(
                subprocess.Popen([*manage, "recoverysweep", "--interval", "5"], env=env)
            )
        self.stdout.write(self.style.MIGRATE_HEADING("4. Dashboard, worker and sweep running"))
        self.stdout.write(f"   dashboard: http://127.0.0.1:{port}/admin/")
        self.stdout.write(f"   user: {DEMO_USER}   password: {DEMO_PASSWORD}")
        self.stdout.write("   Ctrl-C stops everything.")
        try:
            while all(child.poll() is None for child in children):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child in children:
                try:
                    child.wait(timeout=35)
                except subprocess.TimeoutExpired:
                    child.kill()
