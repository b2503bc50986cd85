from django.apps import AppConfig


class LeasingConfig(AppConfig):
    name = "leasing"
    verbose_name = "Leasing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .handlers import autodiscover

        autodiscover()
