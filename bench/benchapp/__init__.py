"""Handlers only the benchmarks run (installed by bench.settings)."""
