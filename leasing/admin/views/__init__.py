"""The admin views of the console, registered by `WorkItemAdmin.get_urls()`.

Each is wrapped in `AdminSite.admin_view`, so it is staff-only and anonymous
users go to the admin login. They read through `leasing.console` and only
build template context; the operator actions they offer go through
`leasing.admin.actions` and `leasing.admin.bulk`. A database that does not
answer gets the 503 page of `unreachable`, never a 500.
"""

from .dashboard import dashboard_view
from .errors import errors_view, retry_group_view
from .history import history_view
from .pauses import pauses_view
from .timeline import timeline_view
from .unreachable import answering_when_unreachable

__all__ = [
    "answering_when_unreachable",
    "dashboard_view",
    "errors_view",
    "history_view",
    "pauses_view",
    "retry_group_view",
    "timeline_view",
]
