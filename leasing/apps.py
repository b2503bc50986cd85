from django.apps import AppConfig


class LeasingConfig(AppConfig):
    name = "leasing"
    verbose_name = "Leasing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at module level: both need the app registry ready.
        from . import checks, tracing  # noqa: F401  (checks registers the system checks)
        from .handlers import autodiscover
        from .tasks import register_task_handler, uses_leasing_backend

        autodiscover()
        tracing.listen()
        if uses_leasing_backend():
            register_task_handler()
