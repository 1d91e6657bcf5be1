"""The documentation site (``make docs``) has an entry for every public name.

``make docs`` builds the site with warnings as errors, and docs/conf.py warns
for a public name or member that the built reference lacks. These tests check
the reference's sources (docs/reference/*.rst) without building, in a fraction
of a second: every name of ``__all__`` of aiolock, aiolock.backoff, aiolock.otel
and aiolock.testing has its autodoc directive, and a class's directive shows its
members. They also test docs/conf.py's pointing of the Markdown pages' links at
the site, and that the command-line reference is made from the parser that
``aiolock --help`` prints.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import re
import types
from dataclasses import dataclass, field

import pytest
from support.checkout import ROOT

import aiolock
import aiolock._cli as _cli
import aiolock.backoff
import aiolock.otel
import aiolock.testing

DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
PUBLIC_MODULES = (aiolock, aiolock.backoff, aiolock.otel, aiolock.testing)

_DIRECTIVE = re.compile(r"^\.\. (?:py:)?(?P<kind>[\w-]+)::\s*(?P<target>[^\s(]+)")
_OPTION = re.compile(r"^\s+:(?P<name>[\w-]+):")
_MODULE_DIRECTIVES = ("automodule", "module", "currentmodule")
_KINDS = {
    "class": ("autoclass", "autoexception", "class", "exception"),
    "function": ("autofunction", "function"),
    "data": ("autodata", "data"),
}


@dataclass
class Entry:
    """One directive of the reference: what it documents, and its options."""

    kind: str
    source: str
    options: set[str] = field(default_factory=set)


def _entries() -> dict[str, Entry]:
    """The reference's directives by the qualified name they document."""
    entries: dict[str, Entry] = {}
    for source in sorted(REFERENCE.glob("*.rst")):
        module = ""
        current: Entry | None = None
        for line in source.read_text(encoding="utf-8").splitlines():
            directive = _DIRECTIVE.match(line)
            option = _OPTION.match(line)
            if directive is not None:
                kind, target = directive["kind"], directive["target"]
                if kind in _MODULE_DIRECTIVES:
                    module = target
                if kind == "currentmodule":
                    current = None
                    continue
                qualified = target if "." in target or kind in _MODULE_DIRECTIVES else ""
                current = entries[qualified or f"{module}.{target}"] = Entry(kind, source.name)
            elif current is not None and option is not None:
                current.options.add(option["name"])
            else:
                current = None  # the options end at the directive's first other line
    return entries


ENTRIES = _entries()


def _public_names() -> list[tuple[types.ModuleType, str]]:
    return [(module, name) for module in PUBLIC_MODULES for name in module.__all__]


def _kind(value: object) -> str:
    if inspect.isclass(value):
        return "class"
    return "function" if callable(value) else "data"


def _routines(cls: type) -> dict[str, type]:
    """The public methods and properties of ``cls`` and its bases within aiolock, by owner.

    (Attributes are documented by the class docstring's Attributes section or by
    ``#:`` comments; the build's own check, in docs/conf.py, covers those too.)
    """
    found: dict[str, type] = {}
    for owner in reversed([c for c in cls.__mro__ if c.__module__.startswith("aiolock")]):
        for name, value in vars(owner).items():
            routine = isinstance(value, property | staticmethod | classmethod)
            if not name.startswith("_") and (routine or inspect.isfunction(value)):
                found[name] = owner
    return found


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_public_module_has_its_page(module: types.ModuleType) -> None:
    """The public module's docstring is in the reference (an automodule directive)."""
    entry = ENTRIES.get(module.__name__)
    assert entry is not None, f"no '.. automodule:: {module.__name__}' in docs/reference/"
    assert entry.kind == "automodule", f"{module.__name__} is a '{entry.kind}' in {entry.source}"


@pytest.mark.parametrize(
    ("module", "name"), _public_names(), ids=[f"{m.__name__}.{n}" for m, n in _public_names()]
)
def test_public_name_is_in_the_reference(module: types.ModuleType, name: str) -> None:
    """The name of the module's __all__ has an entry of its kind in docs/reference/*.rst."""
    value = getattr(module, name)
    qualified = value.__name__ if inspect.ismodule(value) else f"{module.__name__}.{name}"
    entry = ENTRIES.get(qualified)
    assert entry is not None, f"docs/reference/ has no entry for {qualified}"
    expected = ("automodule",) if inspect.ismodule(value) else _KINDS[_kind(value)]
    assert entry.kind in expected, f"{qualified} is a '{entry.kind}' in {entry.source}"


@pytest.mark.parametrize(
    "qualified",
    [
        f"{m.__name__}.{n}"
        for m, n in _public_names()
        if inspect.isclass(getattr(m, n)) and _routines(getattr(m, n))
    ],
)
def test_a_class_entry_shows_its_members(qualified: str) -> None:
    """A public class's entry shows its methods and properties, those of its bases too."""
    module, _, name = qualified.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    entry = ENTRIES.get(qualified)
    if entry is None:
        pytest.skip(f"no entry for {qualified} (see test_public_name_is_in_the_reference)")
    needs = {"members"}
    if any(owner is not cls for owner in _routines(cls).values()):
        needs.add("inherited-members")
    missing = sorted(needs - entry.options)
    assert not missing, f"{qualified} in {entry.source} lacks " + ", ".join(
        f":{o}:" for o in missing
    )


# -- the links of the Markdown pages, pointed at the site ----------------------------------------


def _conf() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("aiolock_docs_conf", DOCS / "conf.py")
    assert spec is not None
    assert spec.loader is not None
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


@pytest.fixture(scope="module")
def retarget() -> types.FunctionType:
    """docs/conf.py's ``_retarget(text, written_in, shown_in)``."""
    function: types.FunctionType = _conf()._retarget
    return function


@pytest.mark.parametrize(
    ("link", "site_link"),
    [
        ("[semantics](docs/semantics.md#fairness)", "[semantics](semantics.md#fairness)"),
        ("[`app`](examples/fastapi_app.py)", "[`app`](../examples/fastapi_app.py)"),
        ("![chart](benchmarks/results/handoff.png)", "![chart](../benchmarks/results/handoff.png)"),
        ("[CHANGELOG.md](CHANGELOG.md)", "[CHANGELOG.md](site/changelog.md)"),
        ("[docs/](docs/README.md)", "[docs/](index.md)"),
        ("[up](#beyond-one-server)", "[up](#beyond-one-server)"),
        ("[web](https://semver.org/)", "[web](https://semver.org/)"),
        ("[gone](docs/no-such-page.md)", "[gone](docs/no-such-page.md)"),
        (
            "`[code](docs/semantics.md)` and [x](CHANGELOG.md)",
            "`[code](docs/semantics.md)` and [x](site/changelog.md)",
        ),
    ],
)
def test_a_readme_link_points_at_the_site(
    retarget: types.FunctionType, link: str, site_link: str
) -> None:
    """A link of README.md, shown in docs/index.md, points at the site's page or file."""
    assert retarget(f"See {link}.", ROOT / "README.md", DOCS / "index.md") == f"See {site_link}."


def test_a_docs_page_link_to_the_readme_points_at_the_home_page(
    retarget: types.FunctionType,
) -> None:
    """A docs page's link to ../README.md#anchor goes to the home page's anchor; others stay."""
    page = DOCS / "semantics.md"
    text = "[a](../README.md#sentinel), [b](failure-modes.md), [c](../examples/fenced_write.py)"
    expected = "[a](index.md#sentinel), [b](failure-modes.md), [c](../examples/fenced_write.py)"
    assert retarget(text, page, page) == expected


def test_links_in_a_code_block_stay(retarget: types.FunctionType) -> None:
    """A fenced code block is left as it is, and the prose after it is retargeted."""
    text = "```md\n[a](docs/semantics.md)\n```\n[b](docs/semantics.md)"
    expected = "```md\n[a](docs/semantics.md)\n```\n[b](semantics.md)"
    assert retarget(text, ROOT / "README.md", DOCS / "index.md") == expected


# -- the command-line reference ------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [[], ["run"], ["status"], ["demo"], ["server"]],
    ids=lambda c: " ".join(["aiolock", *c]),
)
def test_the_cli_reference_parser_is_the_commands(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """build_parser(), which the CLI reference is made from, prints what `aiolock --help` does."""
    with pytest.raises(SystemExit) as exit_:
        _cli.main([*command, "--help"])
    assert exit_.value.code == 0
    parser = _cli.build_parser()
    for action in parser._actions:
        if command and isinstance(action, argparse._SubParsersAction):
            parser = action.choices[command[0]]
    assert capsys.readouterr().out == parser.format_help()
