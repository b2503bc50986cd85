"""The admin of the leasing tables, with the operator console, in Django's contrib layout.

* `options`: the ModelAdmins (registered with the default admin site when
  Django's admin autodiscovers this module);
* `actions`: force-release, force-fail and retry, with their confirmation page;
* `filters`, `changelist`, `paginator`: list filters, exact search, a cheap
  date hierarchy and estimated counts for tables of millions of rows;
* `views`: the dashboard and the per-task checkpoint timeline;
* `workers`: the workers table, with the quiet and stop actions;
* `schedules`: periodic work, editable (settings schedules: only enabled);
* `forms`, `display`, `guards`: the pages' forms, how values are shown, and the
  refusal of input the database cannot store.

Importing it changes nothing on the admin site besides registering the five
ModelAdmins: the link to the dashboard on the admin index is opt-in (see the
README: the `admin/leasing/site_index.html` template).
"""

from .options import CheckpointAdmin, IdempotencyKeyAdmin, WorkItemAdmin
from .schedules import ScheduleAdmin
from .workers import WorkerAdmin

__all__ = [
    "CheckpointAdmin",
    "IdempotencyKeyAdmin",
    "ScheduleAdmin",
    "WorkItemAdmin",
    "WorkerAdmin",
]
