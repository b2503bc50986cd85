"""The test app's views (tests that need them set ROOT_URLCONF to this module)."""

from django.urls import path

from .views import enqueue_traced

urlpatterns = [path("traced/", enqueue_traced, name="enqueue-traced")]
