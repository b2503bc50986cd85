from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo site's handlers (not part of the reusable app)."""

    name = "project.demo"
    label = "demo"
    verbose_name = "Leasing demo"
