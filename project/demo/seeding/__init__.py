"""The demo data set: `python manage.py seed_demo [--fresh] [--scenario PATH]` loads it.

The scenario (`fixtures/demo.json` by default) describes tasks, work items in
every status, checkpoints of every type, workers, a recovery sweep and
idempotency keys, with every time given as an offset in seconds from "now".
It is materialised relative to the database clock, through the services
where they apply: items are enqueued with `enqueue_many`, claimed, retried,
completed and failed by a `LeaseManager` (so tokens and retry counts are what
real runs leave), live checkpoints are written with `create_checkpoint` under
the lease, and the operator action goes through `leasing.operations`. Only
the past is crafted directly: UPDATEs move timestamps back in time, and
checkpoints that happened in the past are INSERTed with their time (the
service stamps "now", and checkpoints cannot be updated afterwards).

Everything runs in one transaction: a bad scenario fails with a one-line
error and leaves the database as it was.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.test.utils import override_settings

from leasing.exceptions import LeasingError
from leasing.models import Worker, WorkItem

from .scenario import DEFAULT_SCENARIO, ScenarioError, Summary, load_scenario
from .seeder import Seeder

__all__ = ["DEFAULT_SCENARIO", "ScenarioError", "Summary", "load_scenario", "seed", "wipe"]

# Leasing tables, children first (checkpoints and keys reference work items).
TABLES = ("checkpoints", "idempotency_keys", "work_items", "workers")


def wipe(using: str = DEFAULT_DB_ALIAS) -> None:
    """Delete every row of the leasing tables (raw DELETEs: checkpoints refuse ORM deletes)."""
    with connections[using].cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"DELETE FROM {table}")


def seed(
    scenario: dict[str, Any], *, fresh: bool = False, using: str = DEFAULT_DB_ALIAS
) -> Summary:
    """Materialise `scenario` relative to the database clock, in one transaction.

    The data set shows work types no handler of this site serves (as a real
    site's producers enqueue work for other services), so it enqueues them
    as a producer-only process would.
    """
    producer = {**getattr(settings, "LEASING", {}), "ALLOW_UNREGISTERED_TYPES": True}
    try:
        with override_settings(LEASING=producer), transaction.atomic(using=using):
            if fresh:
                wipe(using)
            elif (
                WorkItem.objects.using(using).filter(task_id__startswith="demo-").exists()
                or Worker.objects.using(using).filter(worker_id__startswith="demo-").exists()
            ):
                raise ScenarioError(
                    "Demo data is already loaded; run `seed_demo --fresh` to replace it."
                )
            return Seeder(scenario, using).run()
    except LeasingError as exc:
        raise ScenarioError(f"The scenario was refused by the services: {exc}") from exc
