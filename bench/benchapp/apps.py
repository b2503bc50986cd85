from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "leasing_bench"
    verbose_name = "Leasing benchmarks"
