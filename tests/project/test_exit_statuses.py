"""The ``aiolock`` command's exit statuses are listed once, and every list of them agrees.

``aiolock/_cli/_codes.py`` holds the table; the ``--help`` epilogs and the
docstring of ``aiolock._cli`` are made from it, and ``docs/cli.md`` carries
a copy that must be the same, row by row. Nothing here needs a server.
"""

from __future__ import annotations

import argparse
import re

import docutils.core
import docutils.nodes
import pytest
from support.checkout import ROOT

import aiolock._cli
from aiolock._cli import _codes, build_parser
from aiolock._cli._codes import COMMANDS, EXIT_STATUSES, epilog, markdown_table, rst_table


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the parser has no subcommands")


def test_the_cli_page_lists_the_exit_statuses_of_the_table_row_by_row() -> None:
    """docs/cli.md's exit-code table is the one made from EXIT_STATUSES, row for row."""
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = page[page.index("\n## Exit codes\n") :]
    start = section.index("\n| code | command | meaning |\n") + 1
    rows = section[start:].split("\n\n", 1)[0].splitlines()
    expected = markdown_table().splitlines()
    for number, (found, wanted) in enumerate(zip(rows, expected, strict=False)):
        assert found == wanted, f"row {number} of docs/cli.md's table differs; it should be:\n" + (
            "\n".join(expected)
        )
    assert len(rows) == len(expected), "docs/cli.md's table should be:\n" + "\n".join(expected)


def test_each_row_names_the_constant_that_holds_its_code() -> None:
    """A row's name is the constant with its code; every constant has a row."""
    for row in EXIT_STATUSES:
        if row.code == "N":
            assert row.name == "", row
            continue
        value = getattr(_codes, row.name)
        shown = f"{value}+N" if row.name == "EX_SIGNAL_BASE" else str(value)
        assert shown == row.code, row
    constants = {name for name in _codes.__all__ if name.startswith("EX_")}
    assert constants == {row.name for row in EXIT_STATUSES} - {""}


def test_each_row_is_about_known_subcommands_and_each_subcommand_has_its_basics() -> None:
    """Rows name only real subcommands; each subcommand has a 0, a 2 and a 69."""
    assert set(COMMANDS) == set(_subparsers(build_parser()))
    for row in EXIT_STATUSES:
        assert row.commands, row
        assert set(row.commands) <= set(COMMANDS), row
        assert row.meaning.count("`") % 2 == 0, row  # every code mark is closed
    for command in COMMANDS:
        codes = {row.code for row in EXIT_STATUSES if command in row.commands}
        assert {"0", "2", "69"} <= codes, command


def _listed(help_text: str) -> list[tuple[str, str]]:
    """The (code, meaning) pairs under ``exit status:`` in a ``--help``, whitespace made single."""
    listing = help_text[help_text.index("\nexit status:\n") + len("\nexit status:\n") :]
    listing = listing.split("\n\n", 1)[0]
    pairs = []
    for entry in re.split(r"\n(?=  \S)", listing):
        code, meaning = entry.split(None, 1)
        pairs.append((code, " ".join(meaning.split())))
    return pairs


@pytest.mark.parametrize("command", [None, *COMMANDS], ids=lambda c: c or "aiolock")
def test_each_help_ends_with_the_statuses_of_its_subcommand(command: str | None) -> None:
    """``aiolock [COMMAND] --help`` lists the rows about COMMAND (all of them at the top)."""
    root = build_parser()
    parser = root if command is None else _subparsers(root)[command]
    assert parser.epilog is not None
    assert parser.epilog.endswith(epilog(command))
    expected = []
    for row in EXIT_STATUSES:
        if command is not None and command not in row.commands:
            continue
        meaning = row.meaning.replace("`", "")
        if command is None and row.commands != COMMANDS:
            meaning = f"{', '.join(row.commands)}: {meaning}"
        expected.append((row.code, meaning))
    assert _listed(parser.format_help()) == expected


def test_run_s_help_ends_with_the_note_on_its_one_line() -> None:
    """``aiolock run --help`` says, after the statuses, when it prints its one line."""
    parser = _subparsers(build_parser())["run"]
    assert parser.epilog is not None
    assert parser.epilog.endswith(epilog("run"))
    note = " ".join(parser.format_help().rsplit("\n\n", 1)[1].split())
    assert note == _codes.RUN_NOTE.replace("`", "")
    assert 'starting with "aiolock:"' in note


def test_the_package_docstring_carries_the_table_as_valid_restructuredtext() -> None:
    """aiolock._cli's docstring ends with the table, which docutils reads as one row a status."""
    assert aiolock._cli.__doc__ is not None
    assert aiolock._cli.__doc__.rstrip().endswith(rst_table())
    document = docutils.core.publish_doctree(
        rst_table(), settings_overrides={"report_level": 2, "halt_level": 2}
    )
    [table] = document.findall(docutils.nodes.table)
    rows = list(table.findall(docutils.nodes.row))
    assert len(rows) == 1 + len(EXIT_STATUSES)  # the header, then a row a status
    assert [row[0].astext() for row in rows[1:]] == [row.code for row in EXIT_STATUSES]
