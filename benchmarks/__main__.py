"""Run every benchmark one after another: ``python -m benchmarks [--quick] [--only NAME]``.

``--quick``, ``--out`` and ``--loop`` are passed to each benchmark. Results go
to ``benchmarks/out/`` (untracked) unless ``--out`` names another folder
(``--out benchmarks/results``, ``make bench-update``: the committed ones). The exit
status is 1 when any benchmark saw two holders at once (overlaps) or sold more
than its stock (oversold), or failed to run; else 3 when any missed a target (a
``FAIL`` line; ``--quick`` judges none, its lines say ``info``); 0 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from collections.abc import Callable, Sequence

from ._runner import EXIT_MISSED, add_common_args, repro_command

#: The benchmarks, in the order they run.
BENCHMARKS = ("contention", "handoff", "seckill", "redlock", "family", "multi", "failover")


def _load(name: str) -> Callable[[Sequence[str]], int | None] | None:
    """Import ``benchmarks.<name>`` and return its ``main``, or None (with a message)."""
    try:
        module = importlib.import_module(f"{__package__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.{name}":
            raise
        print(f"benchmark {name!r} is not there (no benchmarks/{name}.py); skipped")
        return None
    main = getattr(module, "main", None)
    if not callable(main):
        print(f"benchmarks/{name}.py has no main(argv) function; skipped")
        return None
    runner: Callable[[Sequence[str]], int | None] = main
    return runner


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen benchmarks with the shared options.

    Args:
        argv: command-line options (``sys.argv[1:]`` when None).

    Returns:
        1 if a benchmark did not run or reported an overlap or something oversold,
        else 3 (``EXIT_MISSED``) if one missed a target, else 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Run the aiolock benchmarks one after another."
    )
    add_common_args(parser)
    parser.add_argument(
        "--only", action="append", choices=BENCHMARKS, help="run only this one (repeatable)"
    )
    args = parser.parse_args(argv)
    chosen = [name for name in BENCHMARKS if not args.only or name in args.only]
    passed = ["--out", str(args.out), "--loop", args.loop]
    if args.quick:
        passed.insert(0, "--quick")
    failed: list[str] = []
    missed: list[str] = []
    missing: list[str] = []
    for name in chosen:
        print(f"\n=== {name} ===  ({repro_command(f'benchmarks.{name}', passed)})", flush=True)
        runner = _load(name)
        if runner is None:
            missing.append(name)
            continue
        started = time.monotonic()
        try:
            code = runner(list(passed))
        except SystemExit as exc:  # argparse errors and explicit exits
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            traceback.print_exc()
            code = 1
        print(f"=== {name}: exit {code or 0} in {time.monotonic() - started:.1f} s ===", flush=True)
        if code == EXIT_MISSED:
            missed.append(name)
        elif code:
            failed.append(name)
    if missing:
        print(f"not run (missing): {', '.join(missing)}")
    if missed:
        print(f"MISSED: {', '.join(missed)} (a target: see its FAIL lines)", file=sys.stderr)
    if failed:
        print(
            f"FAILED: {', '.join(failed)} (overlaps, oversold or an error: see above)",
            file=sys.stderr,
        )
        return 1
    if missed:
        return EXIT_MISSED
    print(f"all benchmarks done: {', '.join(n for n in chosen if n not in missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
