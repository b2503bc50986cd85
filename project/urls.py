"""URLs of the demo site: the admin (with the leasing dashboard) and /metrics."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    # /metrics: Prometheus' default metrics_path.
    path("", include("leasing.urls")),
    path("", RedirectView.as_view(pattern_name="admin:index", permanent=False)),
]
