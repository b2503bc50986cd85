"""Benchmarks of the leasing app (GitHub issue 6): `python -m bench.run`.

Speed is proven by these scripts, which print their figures; the test suite
only smoke-tests that they run (tests/bench/test_bench_smoke.py).
"""
