from django.apps import AppConfig


class HaAppConfig(AppConfig):
    name = "tests.ha.app"
    label = "leasing_ha"
