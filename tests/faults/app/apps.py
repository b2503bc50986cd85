import os

from django.apps import AppConfig


class FaultsAppConfig(AppConfig):
    name = "tests.faults.app"
    label = "leasing_faults"

    def ready(self) -> None:
        # Only the fault run's processes record (they are given a directory).
        if os.environ.get("FAULTS_RECORDS"):
            from tests.faults.recorder import connect

            connect()
