"""URLs of the leasing app outside the admin.

    path("leasing/", include("leasing.urls")),   # -> /leasing/metrics

The dashboard and the checkpoint timeline are admin pages, registered by
`WorkItemAdmin.get_urls()`: `admin:leasing_workitem_dashboard` and
`admin:leasing_workitem_timeline`.
"""

from django.urls import path

from . import views

app_name = "leasing"

urlpatterns = [
    path("metrics", views.metrics_view, name="metrics"),
]
