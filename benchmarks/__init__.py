"""Benchmarks: step overhead against Lightning and raw DDP, start-up cost, bootstrap latency per init method.

Run ``python -m benchmarks --quick`` (a smoke run) or ``python -m benchmarks`` (the full run); see docs/benchmarks.md.
"""
