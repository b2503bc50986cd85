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
        # The `claim` scenario's baseline: the claim statement without its
        # pause check, to show what the check costs the worker.
        if os.environ.get("BENCH_WITHOUT_PAUSE_CHECK") == "1":
            from bench.pausecheck import set_pause_check

            set_pause_check(False)
