"""`bench_enqueue PEER COUNT`: COUNT no-op jobs through the peer's own enqueue API.

procrastinate defers them with one `batch_defer()`. django-tasks-db
(`Task.enqueue()`) and django-q2 (`async_task()`) have no batch call, and one
INSERT a job made the backlog take longer than the drains, so each job goes
through the peer's own call while the row it would INSERT is collected (the
pre_save signal django-tasks-db relies on included), and one `bulk_create()`
writes them all: the same rows, fewer round trips. What is compared is how
fast each peer drains, not how fast it enqueues. Prints one JSON line:
{"peer", "count", "seconds"}.
"""

from __future__ import annotations

import json
import time
from typing import Any
from unittest import mock

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

PEERS = ("procrastinate", "django-tasks-db", "django-q2")


class Command(BaseCommand):
    help = "Enqueue COUNT no-op jobs of one peer."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("peer", choices=PEERS)
        parser.add_argument("count", type=int)

    def handle(self, *args: Any, **options: Any) -> None:
        peer, count = options["peer"], options["count"]
        if count <= 0:
            raise CommandError(f"COUNT must be positive, got {count}")
        from bench.peers.site import tasks

        start = time.perf_counter()
        if peer == "procrastinate":
            tasks.procrastinate_noop.batch_defer(*({} for _ in range(count)))
        elif peer == "django-tasks-db":
            _tasks_db(tasks.tasks_db_noop, count)
        else:
            _django_q(count)
        seconds = time.perf_counter() - start
        self.stdout.write(json.dumps({"peer": peer, "count": count, "seconds": round(seconds, 3)}))


def _tasks_db(task: Any, count: int) -> None:
    from django.db.models.signals import pre_save
    from django_tasks_db.models import DBTaskResult

    rows: list[DBTaskResult] = []

    def collect(**fields: Any) -> DBTaskResult:
        row = DBTaskResult(**fields)
        pre_save.send(DBTaskResult, instance=row, raw=False, using="default", update_fields=None)
        rows.append(row)
        return row

    with mock.patch.object(DBTaskResult.objects, "create", collect):
        for _ in range(count):
            task.enqueue()
    with transaction.atomic():
        DBTaskResult.objects.bulk_create(rows, batch_size=2000)


def _django_q(count: int) -> None:
    from django.utils import timezone
    from django_q.brokers.orm import ORM
    from django_q.conf import Conf
    from django_q.models import OrmQ
    from django_q.tasks import async_task

    rows: list[OrmQ] = []

    class Collect(ORM):
        def enqueue(self, task: Any) -> None:
            key = self.list_key or Conf.CLUSTER_NAME
            rows.append(OrmQ(key=key, payload=task, lock=timezone.now()))

    broker = Collect(list_key=Conf.CLUSTER_NAME)
    for _ in range(count):
        async_task("bench.peers.site.tasks.q_noop", broker=broker)
    with transaction.atomic():
        OrmQ.objects.bulk_create(rows, batch_size=2000)
