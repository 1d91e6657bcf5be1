"""The exit statuses of the ``aiolock`` command: one table, and what is made from it.

:data:`EXIT_STATUSES` is the only list of them. Every other text that lists
them is generated from it: the ``exit status:`` part of ``aiolock --help``
and of each ``aiolock COMMAND --help`` (:func:`epilog`), the table in the
docstring of :mod:`aiolock._cli` (:func:`rst_table`), and the table of
``docs/cli.md`` (:func:`markdown_table`; ``tests/project/test_exit_statuses.py``
fails when the page's differs, and prints the table the page should have).

A meaning marks code (an option, a command, a message) with single
backquotes; each rendering makes of them what its format wants.

The constants are the statuses the code returns (``sysexits.h``'s where one
fits, the shell's otherwise); each row names the one it shows.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from typing import Final

__all__ = [
    "COMMANDS",
    "EXIT_STATUSES",
    "EX_CANNOT_EXECUTE",
    "EX_FAILURE",
    "EX_FREE",
    "EX_LOST",
    "EX_NOT_FOUND",
    "EX_OK",
    "EX_SIGNAL_BASE",
    "EX_TEMPFAIL",
    "EX_UNAVAILABLE",
    "EX_USAGE",
    "RUN_NOTE",
    "ExitStatus",
    "epilog",
    "markdown_table",
    "rst_table",
]

#: Success: ``run``'s command exited 0, ``status``'s lock is held, ``demo`` saw no
#: failure, ``server`` was stopped by a signal.
EX_OK: Final = 0
#: ``demo``: a failure (an overlap, a worker error, an acquisition not done).
EX_FAILURE: Final = 1
#: Bad usage (argparse uses it too).
EX_USAGE: Final = 2
#: ``status``: the lock is free; ``leader``: nobody leads.
EX_FREE: Final = 3
#: The server could not be reached or answered with an error (sysexits ``EX_UNAVAILABLE``).
EX_UNAVAILABLE: Final = 69
#: ``run``: the lock was lost (sysexits ``EX_SOFTWARE``).
EX_LOST: Final = 70
#: ``run``: the lock was not acquired in time (sysexits ``EX_TEMPFAIL``).
EX_TEMPFAIL: Final = 75
#: ``run``: the command could not be executed (as the shell says it).
EX_CANNOT_EXECUTE: Final = 126
#: ``run``: the command was not found (as the shell says it).
EX_NOT_FOUND: Final = 127
#: ``run``: the command died of signal N: the status is ``EX_SIGNAL_BASE + N``.
EX_SIGNAL_BASE: Final = 128

#: The subcommands, in the order ``aiolock --help`` lists them.
COMMANDS: Final = ("run", "status", "ls", "release", "leader", "demo", "server")


@dataclass(frozen=True)
class ExitStatus:
    """One row of the table: a status, and what it means for some subcommands.

    Attributes:
        code: the status as shown: ``"0"``, ``"N"`` (the command's own), ``"128+N"``.
        name: the constant of this module that holds it (``""`` for the command's own).
        commands: the subcommands it is about (all of :data:`COMMANDS`: every one).
        meaning: what it means for them, code marked with single backquotes.
    """

    code: str
    name: str
    commands: tuple[str, ...]
    meaning: str


#: Every exit status of every subcommand, by code; a code may have a row per subcommand.
EXIT_STATUSES: Final[tuple[ExitStatus, ...]] = (
    ExitStatus("0", "EX_OK", ("run",), "the command exited 0"),
    ExitStatus(
        "0",
        "EX_OK",
        ("status",),
        "the lock is held (a semaphore: at least one permit is; a read-write lock: "
        "a reader or the writer holds)",
    ),
    ExitStatus(
        "0",
        "EX_OK",
        ("leader",),
        "someone leads (its identity is printed); with `--watch`, stopped by a signal "
        "(SIGINT, SIGTERM)",
    ),
    ExitStatus("0", "EX_OK", ("ls",), "at least one held name matched (and was printed)"),
    ExitStatus(
        "0",
        "EX_OK",
        ("release",),
        "the name was held: it was taken from its holders (printed), and given to the "
        "next waiters if any",
    ),
    ExitStatus("0", "EX_OK", ("demo",), "every acquisition done, no overlap"),
    ExitStatus("0", "EX_OK", ("server",), "stopped by a signal (Ctrl-C, SIGTERM)"),
    ExitStatus("N", "", ("run",), "the command's own exit status, passed through"),
    ExitStatus(
        "1",
        "EX_FAILURE",
        ("demo",),
        "a failure: an overlap, a worker error, or an acquisition not done",
    ),
    ExitStatus(
        "2",
        "EX_USAGE",
        COMMANDS,
        "bad usage: a wrong option or argument (a usage message says which)",
    ),
    ExitStatus(
        "2",
        "EX_USAGE",
        ("run",),
        "a `--limit` below 1, `--limit` with `--fencing` or `--elect`, or `--identity` "
        "without `--elect` (a usage message says which)",
    ),
    ExitStatus(
        "2",
        "EX_USAGE",
        ("run", "status", "ls", "release", "leader", "demo"),
        "a malformed server URL, or a URL option that redis-py does not take or cannot "
        "use, such as `?bogus=1` or `?protocol=9` (one `aiolock:` line names it)",
    ),
    ExitStatus(
        "2",
        "EX_USAGE",
        ("run", "status", "release", "leader"),
        "a name or prefix the lock refuses (an empty name, a name that starts with `}`, "
        "a prefix that contains `{}`); one `aiolock:` line says why",
    ),
    ExitStatus(
        "2",
        "EX_USAGE",
        ("run",),
        "`NAME` is in use by another kind of lock (`--limit` on a lock's name, a plain "
        "run on a semaphore's, either on a read-write lock's); one `aiolock:` line names "
        "the kind; the command did not run",
    ),
    ExitStatus(
        "2",
        "EX_USAGE",
        ("release",),
        "`--force` missing, or a `--by` that is not an identity (empty, control "
        "characters, over 256 characters)",
    ),
    ExitStatus(
        "3",
        "EX_FREE",
        ("status",),
        "the lock is free (a semaphore: no permit is held; a read-write lock: nobody holds)",
    ),
    ExitStatus("3", "EX_FREE", ("leader",), "nobody leads (nothing is printed)"),
    ExitStatus("3", "EX_FREE", ("ls",), "no held name matched (nothing is printed)"),
    ExitStatus(
        "3",
        "EX_FREE",
        ("release",),
        "the name was not held: nothing was released (one line says so)",
    ),
    ExitStatus(
        "69",
        "EX_UNAVAILABLE",
        ("run",),
        "the server could not be reached, answered with an error, or did not answer in "
        "time (`EX_UNAVAILABLE`): before the lock was acquired (the command did not run), "
        "or when releasing it after the command ended (the lock then expires within "
        "`--ttl`)",
    ),
    ExitStatus(
        "69",
        "EX_UNAVAILABLE",
        ("status", "ls", "release", "leader"),
        "the server could not be reached, answered with an error, or did not answer in "
        "time (`EX_UNAVAILABLE`)",
    ),
    ExitStatus(
        "69",
        "EX_UNAVAILABLE",
        ("demo",),
        "the server given by `--url` or `AIOLOCK_URL` could not be reached or answered "
        "with an error; without one, no server binary was found to start one",
    ),
    ExitStatus(
        "69",
        "EX_UNAVAILABLE",
        ("server",),
        "no server binary was found, the server did not start (its port taken?), or it "
        "exited by itself",
    ),
    ExitStatus(
        "70",
        "EX_LOST",
        ("run",),
        "the lock (with `--limit`, the permit; with `--elect`, the lead) was lost "
        "(`EX_SOFTWARE`): while the command "
        "ran (it was sent SIGTERM, then SIGKILL after `--grace` seconds), before the "
        "command started (it did not run), or found at the release after the command had "
        "ended (nothing was terminated)",
    ),
    ExitStatus(
        "75",
        "EX_TEMPFAIL",
        ("run",),
        "the lock was held by someone else (with `--limit`, every permit was taken; with "
        "`--elect`, another candidate led) until "
        "the deadline (`--timeout`; at once with `-n`); the command did not run "
        "(`EX_TEMPFAIL`)",
    ),
    ExitStatus(
        "126", "EX_CANNOT_EXECUTE", ("run",), "the command was found but could not be executed"
    ),
    ExitStatus("127", "EX_NOT_FOUND", ("run",), "the command was not found"),
    ExitStatus(
        "128+N",
        "EX_SIGNAL_BASE",
        ("run",),
        "the command died of signal N (or `aiolock run` got signal N while still waiting "
        "for the lock, and never ran the command)",
    ),
)

#: What ``aiolock run`` prints with a status of its own, and which status wins.
RUN_NOTE: Final = (
    "With a status of its own, `aiolock run` prints exactly one line on stderr, starting "
    "with \"aiolock:\", that says why; with the command's, nothing (`-v` adds the lock's "
    "log records; a bad option gets argparse's usage message instead). The first problem "
    "decides: after a 126, 127, 70 or a signal while waiting, what the release finds is "
    "neither printed nor changes the status; a 69 or 70 from the release replaces only "
    "the command's own status, which its line gives. A command that itself exits 69, 70 "
    "or 75 can be told apart only by the absence of that line."
)

_CODE: Final = re.compile(r"`([^`]+)`")

#: ``--help``'s layout: the code in a column of its own, the meaning wrapped beside it.
_WIDTH: Final = 79
_CODE_COLUMN: Final = 9

#: Stands for a space inside code while a text is wrapped, so that code stays on one line.
_GLUE: Final = "\0"


def _plain(text: str) -> str:
    """``text`` for a terminal: code marks dropped (code kept on one line when wrapped)."""
    return _CODE.sub(lambda code: code[1].replace(" ", _GLUE), text)


def _rst(text: str) -> str:
    """``text`` as reStructuredText: code as inline literals (kept on one line when wrapped)."""
    return _CODE.sub(lambda code: f"``{code[1].replace(' ', _GLUE)}``", text)


def _fill(text: str, initial: str, subsequent: str) -> list[str]:
    """``text`` wrapped to ``--help``'s width; code and words with hyphens stay whole."""
    lines = textwrap.wrap(
        text,
        width=_WIDTH,
        initial_indent=initial,
        subsequent_indent=subsequent,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [line.replace(_GLUE, " ") for line in lines]


def _rows(command: str | None) -> list[ExitStatus]:
    return [row for row in EXIT_STATUSES if command is None or command in row.commands]


def _who(row: ExitStatus) -> str:
    """The subcommands a row is about, in words: ``run``, ``run, status``, ``all``."""
    return "all" if row.commands == COMMANDS else ", ".join(row.commands)


def epilog(command: str | None = None) -> str:
    """The ``exit status:`` part of ``--help``: ``command``'s statuses, or every one.

    Args:
        command: a subcommand; ``None`` for ``aiolock --help``, whose lines name
            the subcommands each status is about.

    Returns:
        The lines, laid out for a terminal; ``run``'s end with :data:`RUN_NOTE`.
    """
    lines = ["exit status:"]
    for row in _rows(command):
        meaning = _plain(row.meaning)
        if command is None and row.commands != COMMANDS:
            meaning = f"{', '.join(row.commands)}: {meaning}"
        head = f"  {row.code:<{_CODE_COLUMN}}"
        lines += _fill(meaning, head, " " * len(head))
    if command == "run":
        lines += ["", *_fill(_plain(RUN_NOTE), "", "")]
    return "\n".join(lines)


def rst_table() -> str:
    """Every status as a reStructuredText simple table (code, command, meaning), then the note.

    The note is :data:`RUN_NOTE`, a paragraph after the table.
    """
    cells = [(row.code, _who(row), _rst(row.meaning)) for row in EXIT_STATUSES]
    code_width = max(len("code"), *(len(code) for code, _, _ in cells))
    who_width = max(len("command"), *(len(who) for _, who, _ in cells))
    meaning_width = _WIDTH - code_width - who_width - 2
    rule = f"{'=' * code_width} {'=' * who_width} {'=' * meaning_width}"
    lines = [rule, f"{'code':<{code_width}} {'command':<{who_width}} meaning", rule]
    indent = " " * (code_width + who_width + 2)
    for code, who, meaning in cells:
        head = f"{code:<{code_width}} {who:<{who_width}} "
        lines += _fill(meaning, head, indent)
    lines += [rule, "", *_fill(_rst(RUN_NOTE), "", "")]
    return "\n".join(lines)


def markdown_table() -> str:
    """Every status as the Markdown table of ``docs/cli.md`` (code, command, meaning)."""
    lines = ["| code | command | meaning |", "|---|---|---|"]
    for row in EXIT_STATUSES:
        who = "all" if row.commands == COMMANDS else ", ".join(f"`{c}`" for c in row.commands)
        lines.append(f"| {row.code} | {who} | {row.meaning} |")
    return "\n".join(lines)
