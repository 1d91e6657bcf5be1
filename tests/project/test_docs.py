"""Cheap checks that keep the documentation true to the code.

The pages are ``README.md`` and ``docs/*.md``. Their ```python blocks must
parse (top-level ``await`` and ``async with`` allowed), their relative links
and anchors must resolve, and the public names must be documented.

A block that shows another library's code (a "before" block of
``docs/migration.md``) is marked ```` ```python peer ````. It must still be
valid Python, but the checks that its aiolock names exist skip it; instead it
must not use aiolock at all.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.checkout import ROOT

import aiolock
import aiolock.backoff

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
#: The documentation site's home page (``make docs``): README.md included, and the navigation.
SITE_HOME = DOCS / "index.md"
#: The info-string word that marks a block of another library's code.
PEER = "peer"
#: Modules that only peer blocks may import.
PEER_MODULES = ("pottery", "aioredlock")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(?P<text>.*?)[ \t]*#*[ \t]*$")
_INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)"
)
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(?P<target>\S+)", re.MULTILINE)
_CODE_SPAN = re.compile(r"(`+)(?P<code>.+?)\1")
#: A test the pages cite: its module by its path from the root or by its file name alone, and
#: maybe one of its tests (``tests/mechanisms/test_notify.py``, ``test_lock.py::test_name``).
_CITED_TEST = re.compile(
    r"(?<![\w/])(?P<module>(?:tests/(?:\w+/)*)?test_\w+\.py)(?:::(?P<test>\w+))?"
)
#: The suite's test modules by file name (the names are unique across the folders of tests/).
TEST_MODULES = {path.name: path for path in (ROOT / "tests").rglob("test_*.py")}
#: Test files the pages name that are not the suite's: the reader's own (docs/testing.md).
READERS_FILES = {"test_locks.py"}


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int
    language: str
    flags: tuple[str, ...]
    source: str

    @property
    def where(self) -> str:
        """``path:line`` of the block's opening fence."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _split(page: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The page's fenced blocks, and its other lines (number, text)."""
    blocks: list[Block] = []
    prose: list[tuple[int, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            prose.append((index + 1, lines[index]))
            index += 1
            continue
        fence = opening["fence"]
        words = opening["info"].split()
        body: list[str] = []
        index += 1
        while index < len(lines):
            closing = _FENCE.match(lines[index])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(lines[index])
            index += 1
        start = index - len(body)
        language = words[0].lower() if words else ""
        source = textwrap.dedent("\n".join(body)) + "\n"
        blocks.append(Block(page, start, language, tuple(words[1:]), source))
        index += 1
    return blocks, prose


def _python_blocks() -> list[Block]:
    return [b for page in PAGES for b in _split(page)[0] if b.language in ("python", "py")]


PYTHON_BLOCKS = _python_blocks()
AIOLOCK_BLOCKS = [b for b in PYTHON_BLOCKS if PEER not in b.flags]
PEER_BLOCKS = [b for b in PYTHON_BLOCKS if PEER in b.flags]


def _parse(block: Block) -> ast.Module:
    tree = compile(
        block.source,
        block.where,
        "exec",
        flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
    )
    assert isinstance(tree, ast.Module)
    return tree


def _tree(block: Block) -> ast.Module:
    """The block's syntax tree; a block that does not parse is test_python_block_parses' failure."""
    try:
        return _parse(block)
    except SyntaxError:
        pytest.skip(f"{block.where} does not parse (see test_python_block_parses)")


def _plain_text(markdown: str) -> str:
    """The text of a heading as GitHub renders it: code spans kept, links reduced to labels."""
    text = _CODE_SPAN.sub(lambda m: m["code"].strip(), markdown)
    return re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = unicodedata.normalize("NFC", _plain_text(heading)).lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in _split(page)[1]:
        heading = _HEADING.match(line)
        if heading is None:
            continue
        slug = _slug(heading["text"])
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> Iterator[tuple[int, str]]:
    """Every link target in the page's prose (code blocks and code spans excluded)."""
    for number, line in _split(page)[1]:
        prose = _CODE_SPAN.sub("", line)
        for match in _INLINE_LINK.finditer(prose):
            yield number, match["target"].strip("<>")
        for match in _REFERENCE.finditer(prose):
            yield number, match["target"]


def _relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("//")


def _code_spans(*pages: Path) -> str:
    """The text of every code span and code block of ``pages``, one per line."""
    parts: list[str] = []
    for page in pages:
        blocks, prose = _split(page)
        parts.extend(block.source for block in blocks)
        parts.extend(m["code"] for _, line in prose for m in _CODE_SPAN.finditer(line))
    return "\n".join(parts)


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", text) is not None


def _public_members(cls: type) -> list[str]:
    return sorted(n for n in dir(cls) if not n.startswith("_"))


def _parameters(function: object) -> set[str]:
    return set(inspect.signature(function).parameters)  # type: ignore[arg-type]


# -- every page ----------------------------------------------------------------------------------


def test_the_pages_exist() -> None:
    """The docs index and the first pages of the guide (semantics to migration) exist."""
    names = {page.name for page in DOCS.glob("*.md")}
    assert {"README.md", "semantics.md", "failure-modes.md", "recipes.md", "migration.md"} <= names


def test_every_docs_page_is_in_the_index() -> None:
    """docs/README.md links every other page of docs/, but the site's home page."""
    index = DOCS / "README.md"
    linked = {target.split("#")[0] for _, target in _links(index)}
    pages = [p for p in DOCS.glob("*.md") if p not in (index, SITE_HOME)]
    missing = [p.name for p in pages if p.name not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.where)
def test_python_block_parses(block: Block) -> None:
    """The python block is valid Python (top-level await and async with allowed)."""
    try:
        _parse(block)
    except SyntaxError as exc:
        pytest.fail(f"{block.where}: {exc.msg} (block line {exc.lineno})")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    """Every relative link of the page names an existing file, and an existing heading."""
    broken: list[str] = []
    for number, target in _links(page):
        if not _relative(target):
            continue
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"line {number}: {target} (no such file)")
        elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
            broken.append(f"line {number}: {target} (no heading with the anchor #{anchor})")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_tests_exist(page: Path) -> None:
    """Every test module the page cites exists, and so does every test it names in one."""
    missing: list[str] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        for cited in _CITED_TEST.finditer(line):
            name = cited["module"]
            if name in READERS_FILES:
                continue
            module = ROOT / name if "/" in name else TEST_MODULES.get(name)
            if module is None or not module.is_file():
                missing.append(f"line {number}: {name} (no such test module)")
            elif cited["test"] and not re.search(
                rf"^(?:async )?def {cited['test']}\(", module.read_text(encoding="utf-8"), re.M
            ):
                missing.append(f"line {number}: {name}::{cited['test']} (no such test)")
    assert not missing, f"{page.relative_to(ROOT)}:\n" + "\n".join(missing)


def test_test_module_names_are_unique() -> None:
    """No two test modules under tests/ share a file name (the pages cite a module by it)."""
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    assert sorted(names) == sorted(TEST_MODULES), sorted(n for n in names if names.count(n) > 1)


# -- the code in the blocks ----------------------------------------------------------------------


@pytest.mark.parametrize("block", AIOLOCK_BLOCKS, ids=lambda b: b.where)
def test_aiolock_names_in_a_block_exist(block: Block) -> None:
    """What the block imports from aiolock exists, and its lock options are real parameters."""
    lock_options = _parameters(aiolock.AsyncLock)
    accepted = {
        "AsyncLock": lock_options,
        "Redlock": _parameters(aiolock.Redlock),
        "Semaphore": _parameters(aiolock.Semaphore) - {"refused"},
        "ReadWriteLock": _parameters(aiolock.ReadWriteLock) - {"refused"},
    }
    guard = getattr(aiolock, "guard", None)  # a missing guard fails as a missing import
    if guard is not None:
        accepted["guard"] = lock_options | (_parameters(guard) - {"options"})
    problems: list[str] = []
    for node in ast.walk(_tree(block)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("aiolock"):
            module = __import__(node.module, fromlist=["_"])
            problems += [
                f"{node.module} has no {a.name}" for a in node.names if not hasattr(module, a.name)
            ]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            known = accepted.get(node.func.id)
            if known is not None:
                problems += [
                    f"{node.func.id}() has no option {k.arg}={ast.unparse(k.value)}"
                    for k in node.keywords
                    if k.arg is not None and k.arg not in known
                ]
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "backoff"
            and not hasattr(aiolock.backoff, node.attr)
        ):
            problems.append(f"aiolock.backoff has no {node.attr}")
    assert not problems, f"{block.where}: " + "; ".join(problems)


@pytest.mark.parametrize("block", AIOLOCK_BLOCKS, ids=lambda b: b.where)
def test_unmarked_blocks_do_not_show_peer_code(block: Block) -> None:
    """A block that imports pottery or aioredlock, or calls client.lock(), is marked peer."""
    offending: list[str] = []
    for node in ast.walk(_tree(block)):
        if isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            offending += [m for m in modules if m.split(".")[0] in PEER_MODULES]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "lock"
        ):
            offending.append(f"{ast.unparse(node.func)}()")
    assert not offending, f"{block.where} shows {offending}: mark it ```python {PEER}"


@pytest.mark.parametrize("block", PEER_BLOCKS, ids=lambda b: b.where)
def test_peer_blocks_do_not_use_aiolock(block: Block) -> None:
    """A block marked peer shows only the other library: it imports nothing from aiolock."""
    for node in ast.walk(_tree(block)):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("aiolock"), block.where
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("aiolock") for a in node.names), block.where


@pytest.mark.parametrize(
    ("page", "peers"),
    [
        ("migration.md", ("redis.exceptions",)),
        ("migration-pottery-aioredlock.md", ("pottery", "aioredlock")),
    ],
)
def test_migration_shows_a_before_block_per_peer(page: str, peers: tuple[str, ...]) -> None:
    """Each migration page has a marked before block for each library it maps."""
    sources = [b.source for b in PEER_BLOCKS if b.page.name == page]
    for peer in peers:
        assert any(peer in source for source in sources), f"no peer block of {page} uses {peer}"


# -- the public names are documented -------------------------------------------------------------


@pytest.mark.parametrize("name", aiolock.__all__)
def test_public_name_is_in_semantics_or_readme(name: str) -> None:
    """Every name of aiolock.__all__ appears in code in docs/semantics.md or README.md."""
    found = _mentions(_code_spans(DOCS / "semantics.md", ROOT / "README.md"), name)
    assert found, f"aiolock.{name} appears in neither semantics.md nor README"


@pytest.mark.parametrize("member", _public_members(aiolock.AsyncLock))
def test_async_lock_member_is_in_semantics_or_readme(member: str) -> None:
    """Every public method and property of AsyncLock appears in semantics.md or README."""
    found = _mentions(_code_spans(DOCS / "semantics.md", ROOT / "README.md"), member)
    assert found, f"AsyncLock.{member} is in neither semantics.md nor README"


@pytest.mark.parametrize("name", aiolock.backoff.__all__)
def test_backoff_policy_is_documented(name: str) -> None:
    """Every name of aiolock.backoff appears in code somewhere in the docs or README."""
    found = _mentions(_code_spans(*PAGES), name)
    assert found, f"aiolock.backoff.{name} appears in no page"
