"""Benchmark scripts: they print figures and assert nothing (``python -m benchmarks.run_all``)."""
