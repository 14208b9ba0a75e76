"""Tracing: the per-rank timeline (`timeline`) and the scaling report
(`scaling`).

Imports `mpi` and `process` below it, nothing above.
"""
