"""URLs of the leasing app outside the admin: the Prometheus endpoint.

    path("", include("leasing.urls")),           # -> /metrics (Prometheus' default path)
    path("leasing/", include("leasing.urls")),   # -> /leasing/metrics

The dashboard and the checkpoint timeline are admin pages, registered by
`WorkItemAdmin.get_urls()`: `admin:leasing_workitem_dashboard` and
`admin:leasing_workitem_timeline`.
"""

from django.urls import path

from . import views
from .metrics import answer_when_unavailable

app_name = "leasing"

urlpatterns = [
    path("metrics", answer_when_unavailable(views.metrics_view), name="metrics"),
]
