"""The ``aiolock`` command's parser, as the command-line reference shows it.

sphinx-argparse reads a parser's description and epilog as reStructuredText.
The descriptions are plain paragraphs, but the epilogs (an example and the
exit statuses) are laid out in lines for a terminal, so each is shown here as a
literal block, as ``aiolock COMMAND --help`` prints it. The options and their
help come from :func:`aiolock._cli.build_parser` unchanged.
"""

from __future__ import annotations

import argparse
import textwrap

from aiolock._cli import build_parser


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser's subcommands' parsers, in the order ``--help`` lists them."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found += dict.fromkeys(action.choices.values())
    return found


def parser() -> argparse.ArgumentParser:
    """``aiolock``'s parser, every epilog made a literal block."""
    root = build_parser()
    for each in [root, *_subparsers(root)]:
        if each.epilog:
            each.epilog = ".. code-block:: text\n\n" + textwrap.indent(each.epilog, "    ")
    return root
