"""Benchmarks of aiolock against redis-py's lock and a raw SET NX / compare-and-delete floor.

Run them all with ``python -m benchmarks`` (or ``make bench``), or one with
``python -m benchmarks.<name>``; ``--quick`` gives a few-second smoke run. Each
writes its chart and figures to ``benchmarks/out/`` (untracked); ``--out
benchmarks/results`` (or ``make bench-update``) rewrites the committed ones.

Comparing two versions of aiolock: ``python -m benchmarks.compare --base REV
[--bench contention,handoff,redlock] [--rounds N] [--quick]`` runs the chosen
benchmarks alternately against aiolock at git revision ``REV`` (default
``HEAD``, exported to a temporary directory) and the working tree's aiolock,
``N`` runs each, and prints each headline figure's base median, new median and
new/base (``--bench contention --workload W1`` for the uncontended cycle
alone). See :mod:`benchmarks.compare`.

How the harness is laid out (the subjects, the runner, the benchmarks) and
how to add a subject or a benchmark: docs/benchmarks.md.
"""
