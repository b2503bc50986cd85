"""Dependencies between work items: the `work_item_dependencies` table.

One row per edge: `dependent` is not claimable until `dependency` completed.
The rows are written only by `leasing.sql.dependencies` (at enqueue); the
dependent's `dependencies_left` counts its edges whose dependency has not
completed, so a claim never reads this table. Purging either item removes
the edge (ON DELETE CASCADE).
"""

from __future__ import annotations

from django.db import models

from .work_items import DB_CASCADE, WorkItem


class WorkItemDependency(models.Model):
    pk = models.CompositePrimaryKey("dependency", "dependent")
    # The primary key's index (dependency first) finds the dependents of an
    # item that completes or fails.
    dependency = models.ForeignKey(
        WorkItem,
        on_delete=DB_CASCADE,
        db_column="dependency_id",
        db_index=False,
        related_name="dependent_links",
    )
    dependent = models.ForeignKey(
        WorkItem,
        on_delete=DB_CASCADE,
        db_column="dependent_id",
        db_index=False,  # work_item_deps_dependent_idx
        related_name="dependency_links",
    )

    class Meta:
        db_table = "work_item_dependencies"
        indexes = [
            # What an item waits for (the console's item page).
            models.Index(fields=["dependent"], name="work_item_deps_dependent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.dependent_id} after {self.dependency_id}"
