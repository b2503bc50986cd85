import os

from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "bench.benchapp"
    label = "leasing_bench"
    verbose_name = "Leasing benchmarks"

    def ready(self) -> None:
        # The `signals` scenario: the same drain with a receiver on every lease
        # signal, to show what listening costs (and that not listening is free).
        if os.environ.get("BENCH_SIGNAL_RECEIVERS") == "1":
            from bench.benchapp import receivers

            receivers.connect_all()
