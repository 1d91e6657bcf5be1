"""Sphinx configuration of aiolock's documentation site: ``make docs``.

Why Sphinx, with the furo theme and myst-parser, and not MkDocs with
mkdocstrings: the docstrings are Google style (napoleon reads their Args,
Returns and Raises sections) written in reStructuredText inline markup:
``code``, :class:`AsyncLock`, :meth:`acquire`, :mod:`aiolock.backoff`,
:attr:`lost`. autodoc renders that markup and resolves those roles into
links; mkdocstrings would show them raw. myst-parser reads the Markdown pages
(README.md, docs/*.md) as they are on GitHub.

The site's sources are this folder (``docs/``):

- ``index.md``: the home page, README.md included whole, and the navigation;
- the Markdown pages of ``docs/`` (``docs/README.md``, their index on
  GitHub, is left out: the navigation replaces it);
- ``site/``: the pages only the site has (the benchmark charts, the changelog);
- ``reference/``: the API reference (autodoc) and the command-line reference
  (sphinx-argparse, from :func:`aiolock._cli.build_parser` through
  ``reference/cli_parser.py``).

The pages link files of the repository by relative paths that work on GitHub
(``../README.md#sentinel``, ``../examples/fastapi_app.py``). :func:`_retarget`
points those links at the site: a file that the site shows as a page under
another name (README.md is ``index``) becomes a link to that page, anchors
kept; any other file of the repository becomes a link relative to the page
that shows it, which myst-parser turns into a download (sources) or an image.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst.states import Inliner
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.ext.napoleon.docstring import GoogleDocstring
from sphinx.transforms import SphinxTransform
from sphinx.util import logging

import aiolock
import aiolock.backoff
import aiolock.otel
import aiolock.testing

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

project = "aiolock"
author = "The aiolock authors"
copyright = "the aiolock authors"
release = aiolock.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# docs/README.md is the index of the pages on GitHub; the site's navigation replaces it.
exclude_patterns = ["_build", "README.md"]
nitpicky = True
nitpick_ignore_regex = [
    # Other libraries' names in signatures and docstrings (redis-py, OpenTelemetry, the
    # standard library): this site has no page for them to link to.
    ("py:.*", r"(redis|anyio|opentelemetry|asyncio|_asyncio|collections\.abc|typing)\..+"),
    ("py:.*", r"contextlib\..+"),
    ("py:.*", r"Redis|RedisCluster|MeterProvider|str\.format"),
    # aiolock's private names (a sentinel's type in a signature, a private module named by a
    # docstring): not part of the reference, so shown without a link.
    ("py:.*", r"aiolock\._\w+(\..+)?"),
    # guard's type variables.
    ("py:class", r"P|R"),
]

# -- Markdown (myst-parser) -----------------------------------------------------------------------

# Anchors as GitHub makes them, so that links such as semantics.md#fairness work on both.
myst_heading_anchors = 6
myst_heading_slug_func = "github"

# -- the API reference (autodoc, napoleon) ------------------------------------------------------

autodoc_member_order = "bysource"
# A signature longer than this shows one parameter a line.
python_maximum_signature_line_length = 88
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
# A type alias that some modules import only for type checkers: shown as what it stands for.
autodoc_type_aliases = {"Client": "Redis | RedisCluster"}
autoclass_content = "class"  # __init__'s arguments are in the class docstring (D107)
# napoleon's own handler is off: _google_docstring applies its Google style to every
# docstring but a property's or an attribute's (see there).
napoleon_google_docstring = False
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# The types of a dataclass's fields are in its signature already.
napoleon_attr_annotations = False

# -- HTML (furo) --------------------------------------------------------------------------------

html_theme = "furo"
html_static_path = ["_static"]
html_css_files = ["tables.css"]  # the wide tables of the guide read from the top
html_title = f"aiolock {release}"
html_show_sourcelink = False
html_copy_source = False

# -- links from the Markdown pages to the repository's files --------------------------------------

#: Files of the repository that the site shows as a page of its own under another path.
SITE_PAGES = {
    ROOT / "README.md": DOCS / "index.md",
    ROOT / "CHANGELOG.md": DOCS / "site" / "changelog.md",
    DOCS / "README.md": DOCS / "index.md",
}

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+).+?\1")
_INLINE_LINK = re.compile(
    r"(?P<head>!?\[(?:[^\[\]]|\[[^\]]*\])*\]\()(?P<target><[^>]*>|[^)\s]+)(?=[\s)])"
)
_REFERENCE = re.compile(r"^(?P<head> {0,3}\[[^\]]+\]:\s*)(?P<target>\S+)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def _site_target(target: str, written_in: Path, shown_in: Path) -> str:
    """Where ``target``, a link of the file ``written_in``, points from the page ``shown_in``."""
    bare = target.strip("<>")
    if not bare or bare.startswith(("#", "/")) or _SCHEME.match(bare):
        return target
    path, hash_, anchor = bare.partition("#")
    destination = (written_in.parent / path).resolve()
    if not destination.is_file():
        return target  # not a file of the repository: left for Sphinx to report
    destination = SITE_PAGES.get(destination, destination)
    return Path(os.path.relpath(destination, shown_in.parent)).as_posix() + hash_ + anchor


def _retarget(text: str, written_in: Path, shown_in: Path) -> str:
    """``text`` (Markdown) with its relative links pointed at the site (see the module docstring).

    Code blocks are left alone, and so are code spans outside a link's text.
    """

    def prose(line: str) -> str:
        # Code spans masked with the same number of characters: a link is found around them
        # (a link's text may be a code span), never inside one.
        masked = _CODE_SPAN.sub(lambda span: "`" * len(span[0]), line)
        found = [*_INLINE_LINK.finditer(masked), *_REFERENCE.finditer(masked)]
        for match in sorted(found, key=lambda m: m.start("target"), reverse=True):
            start, end = match.span("target")
            line = line[:start] + _site_target(line[start:end], written_in, shown_in) + line[end:]
        return line

    lines: list[str] = []
    fence = ""
    for line in text.split("\n"):
        opening = _FENCE.match(line)
        if fence:
            if opening and opening[1][0] == fence[0] and len(opening[1]) >= len(fence):
                fence = ""
            lines.append(line)
        elif opening:
            fence = opening[1]
            lines.append(line)
        else:
            lines.append(prose(line))
    return "\n".join(lines)


def _retarget_page(app: Sphinx, docname: str, source: list[str]) -> None:
    """``source-read``: a Markdown page's links, pointed at the site."""
    page = Path(app.env.doc2path(docname))
    if page.suffix == ".md":
        source[0] = _retarget(source[0], page, page)


def _retarget_included(app: Sphinx, path: Path, docname: str, content: list[str]) -> None:
    """``include-read``: the links of an included file, pointed at the site from its page."""
    included = (Path(app.srcdir) / path).resolve()
    page = Path(app.env.doc2path(app.env.current_document.docname))
    if included.suffix == ".md":
        content[0] = _retarget(content[0], included, page)


# -- docstrings ---------------------------------------------------------------------------------


def _google_docstring(
    app: Sphinx, what: Any, name: str, obj: object, options: Any, lines: list[str]
) -> None:
    """``autodoc-process-docstring``: napoleon's Google style, but not for properties or attributes.

    For those napoleon reads the first line as Google style's ``type: description``;
    aiolock's take their type from the annotation and open with a sentence that may
    hold a colon ("The lock's key: ``<prefix>{<name>}``"), whose start it would show
    as the type.
    """
    if what in ("property", "attribute", "data"):
        return
    lines[:] = GoogleDocstring(lines, app.config, app, what, name, obj, options).lines()


def _section_role(
    name: str,
    rawtext: str,
    text: str,
    lineno: int,
    inliner: Inliner,
    options: dict[str, Any] | None = None,
    content: list[str] | None = None,
) -> tuple[list[nodes.Node], list[nodes.system_message]]:
    """``:section:`semantics#fairness```: a link from a docstring to a heading of a page.

    The docstrings are reStructuredText, which cannot name the anchors that
    myst-parser gives the headings of the Markdown pages. This role makes the
    same reference as a page's ``[](semantics.md#fairness)``: myst-parser
    resolves it, shows the heading's text, and warns (an error with -W) for a
    page or an anchor that does not exist. Without ``#`` it links the page.
    """
    docname, _, anchor = text.partition("#")
    env = inliner.document.settings.env
    node = addnodes.pending_xref(
        rawtext,
        nodes.inline(rawtext, ""),
        reftype="myst",
        refdomain="doc",
        reftarget=docname,
        reftargetid=anchor or None,
        refexplicit=False,
        refdoc=env.docname,
    )
    return [node], []


class _NoSmartQuotesInTheCommandLine(SphinxTransform):
    """The command-line reference as ``--help`` writes it: no smart quotes there.

    Its descriptions and help texts name options as plain text, and smart quotes
    would print the ``--`` of ``--ttl`` as an en dash. Elsewhere, options are
    written as code, which smart quotes leave alone.
    """

    default_priority = 700  # before Sphinx's SmartQuotes (750)

    def apply(self, **kwargs: Any) -> None:
        if self.env.current_document.docname == "reference/cli":
            self.document["support_smartquotes"] = False


# -- every public name is in the reference -------------------------------------------------------

#: The public modules, each with its ``__all__``: the reference documents every name.
PUBLIC_MODULES = (aiolock, aiolock.backoff, aiolock.otel, aiolock.testing)


def _public_members(cls: type) -> list[str]:
    """The public methods and properties of ``cls`` and of its bases within aiolock."""
    own = [c for c in cls.__mro__ if c.__module__.startswith("aiolock")]
    return sorted({n for c in own for n in vars(c) if not n.startswith("_")})


def _check_reference(app: Sphinx, env: BuildEnvironment) -> None:
    """``env-check-consistency``: warn (an error with -W) for a public name without an entry."""
    log = logging.getLogger(__name__)
    objects = env.domains.python_domain.objects
    modules = env.domains.python_domain.modules
    for module in PUBLIC_MODULES:
        if module.__name__ not in modules:
            log.warning("the reference has no entry for the module %s", module.__name__)
        for name in module.__all__:
            value: Any = getattr(module, name)
            qualified = f"{module.__name__}.{name}"
            if inspect.ismodule(value):
                if value.__name__ not in modules:
                    log.warning("the reference has no entry for the module %s", value.__name__)
                continue
            if qualified not in objects:
                log.warning("the reference has no entry for %s", qualified)
                continue
            if inspect.isclass(value):
                for member in _public_members(value):
                    if f"{qualified}.{member}" not in objects:
                        log.warning("the reference has no entry for %s.%s", qualified, member)


def setup(app: Sphinx) -> dict[str, Any]:
    """Hook the link retargeting and the reference check into the build."""
    app.connect("autodoc-process-docstring", _google_docstring)
    app.add_role("section", _section_role)
    app.add_transform(_NoSmartQuotesInTheCommandLine)
    app.connect("source-read", _retarget_page)
    app.connect("include-read", _retarget_included)
    app.connect("env-check-consistency", _check_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
