"""Benchmarks (``mpreplay bench NAME`` or ``python -m mpreplay.bench NAME``)."""
