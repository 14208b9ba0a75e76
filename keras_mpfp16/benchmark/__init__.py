"""Benchmarks users run on their own machines: `python -m keras_mpfp16.benchmark`."""
