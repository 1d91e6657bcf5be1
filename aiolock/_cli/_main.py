"""``aiolock``'s entry point: parse the command line, run the subcommand, return its status.

Each subcommand's module is imported only when it runs, so that ``--help``
and a usage error import no more than the parser.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from ._parser import parsers

__all__ = ["main"]


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


def _log_warnings() -> None:
    """Show the library's warnings (and worse) on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("aiolock: %(levelname)s: %(message)s"))
    handler.setLevel(logging.WARNING)
    library = logging.getLogger("aiolock")
    library.addHandler(handler)
    library.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aiolock`` command line; return its exit status.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status (see :mod:`aiolock._cli._codes`).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if arguments[:1] == ["run"] and "--" in arguments:
        cut = arguments.index("--")
        arguments, command = arguments[:cut], arguments[cut + 1 :]
    found = parsers(command_after_dashes=command is not None)
    args, unknown = found.root.parse_known_args(arguments)
    if unknown:
        found.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")

    if args.command == "run":
        if command is None:
            command = list(args.argv)
        if not command:
            found.commands["run"].error("the command to run is missing (give it after --)")
        if args.elect and args.limit is not None:
            found.commands["run"].error(
                "--elect cannot go with --limit: an election has one leader at a time"
            )
        if args.identity is not None and not args.elect:
            found.commands["run"].error("--identity goes with --elect only")
        if args.limit is not None and args.fencing:
            found.commands["run"].error(
                "--fencing cannot go with --limit: a semaphore's holders run at the same "
                "time, so no order of holders exists to fence"
            )
        from ._run import RunConfig, run_command  # imported here: --help does not load it
        from ._urls import resolve_url

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
                fencing=args.fencing or args.elect,
                limit=args.limit,
                elect=args.elect,
                identity=args.identity,
            )
        )
    if args.command == "status":
        from ._status import StatusConfig, show_status
        from ._urls import resolve_url

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
    if args.command == "ls":
        from ._admin import ListConfig, list_names
        from ._urls import resolve_url

        _quiet_logging(args.verbose)
        return list_names(
            ListConfig(
                pattern=args.pattern,
                url=resolve_url(args.url),
                cluster=args.cluster,
                prefix=args.prefix,
                limit=args.limit,
                json=args.json,
            )
        )
    if args.command == "release":
        from ._admin import ForceConfig, force
        from ._urls import resolve_url

        if not args.force:
            found.commands["release"].error(
                "release needs --force: it frees a name that someone else may hold"
            )
        _quiet_logging(args.verbose)
        if not args.verbose:  # the act is logged on stderr either way
            _log_warnings()
        return force(
            ForceConfig(
                name=args.name,
                url=resolve_url(args.url),
                cluster=args.cluster,
                prefix=args.prefix,
                by=args.by,
                json=args.json,
            )
        )
    if args.command == "leader":
        from ._leader import LeaderConfig, show_leader
        from ._urls import resolve_url

        _quiet_logging(args.verbose)
        return show_leader(
            LeaderConfig(
                name=args.name,
                url=resolve_url(args.url),
                cluster=args.cluster,
                prefix=args.prefix,
                watch=args.watch,
            )
        )
    if args.command == "demo":
        from ._demo import demo

        return demo(
            url=args.url,
            processes=args.processes,
            coroutines=args.coroutines,
            rounds=args.rounds,
            hold=args.hold,
            name=args.name,
        )
    if args.command == "server":
        from ._server import serve

        return serve(args.host, args.port)
    return 2  # pragma: no cover - argparse rejects unknown commands
