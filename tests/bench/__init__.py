"""Every benchmark scenario at small sizes (`make test-bench-smoke`): it runs, never a speed."""
