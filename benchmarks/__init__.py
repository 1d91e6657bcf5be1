"""Benchmarks of aiolock against redis-py's lock and a raw SET NX / compare-and-delete floor.

Run them all with ``python -m benchmarks`` (or ``make bench``), or one with
``python -m benchmarks.<name>``; ``--quick`` gives a few-second smoke run.
"""
