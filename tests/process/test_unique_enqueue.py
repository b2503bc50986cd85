"""Unique enqueue: a held key returns its holder instead of inserting (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import time

import pytest

from leasing.models import WorkItem

pytestmark = [pytest.mark.long, pytest.mark.django_db]


# --- the scopes -------------------------------------------------------------------------------


# --- batches -----------------------------------------------------------------------------------


# --- validation ------------------------------------------------------------------------------


# --- the race, with real processes -----------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scope", ["pending", "unfinished", "3600"])
def test_eight_processes_racing_on_each_of_250_keys_make_one_row_per_key(spawn, scope):
    # Every process enqueues the same 250 keys in the same order, so the
    # processes meet on key after key: 250 races of up to eight inserts each.
    keys = 250
    start_at = time.time() + 3.0  # every process has started (Django set up) by then
    procs = [
        spawn("-m", "tests.procs.enqueue_unique", f"race:{scope}", scope, str(keys), str(start_at))
        for _ in range(8)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))

    stored = {item.unique_key: item.work_item_id for item in WorkItem.objects.all()}
    assert WorkItem.objects.count() == keys
    assert sorted(stored) == sorted(f"race:{scope}-{i}" for i in range(keys))
    # Exactly one call inserted each key; the other seven were told they got
    # a duplicate of that very row.
    assert sum(r["inserted"] for r in results) == keys
    assert sum(r["duplicates"] for r in results) == 7 * keys
    for result in results:
        assert result["ids"] == stored
