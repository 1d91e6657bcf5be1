"""The key tables of the docs list exactly the keys and channels the code names (no server).

Key names are built in one place (``aiolock/_keys.py``, the read-write
index's suffix in ``aiolock/_scripts.py``, the grant channel's tag in
``aiolock/_notify.py``). The semantics page lists every key of each
primitive once, and the server-queue page the lock's again, in its own
words: each of those tables must name exactly the keys the code builds for
its kind, so that neither can drift from the code nor from the other.
"""

from __future__ import annotations

import re

import pytest
from support.checkout import ROOT

from aiolock._keys import Keys
from aiolock._scripts import RW_INDEX_SUFFIX

LOCK = "<prefix>{<name>}"


def built(kind: str) -> set[str]:
    """Every key and channel name the code builds for a primitive of ``kind``."""
    keys = Keys("<name>", "<prefix>", kind=kind)
    names = {
        keys.lock,
        keys.queue,
        keys.entry("<token>"),
        keys.mark("<id>"),
        keys.forced("<token>"),
        keys.channel,
        f"{keys.channel}:<tag>",  # a process's grant channel (aiolock._notify.grant_tag)
    }
    if kind == "lock":
        names.add(keys.fence)
    if kind == "rw":
        names.add(keys.lock + RW_INDEX_SUFFIX)
    return names


def key_tables(page: str) -> list[set[str]]:
    """The key names in the first column of each table of ``page`` headed ``| key |``."""
    tables: list[set[str]] = []
    rows: list[str] | None = None
    for line in (ROOT / "docs" / page).read_text().splitlines():
        if line.startswith("| key |"):
            rows = []
            tables.append(set())
            continue
        if rows is None:
            continue
        if not line.startswith("|"):
            rows = None
            continue
        first = line.strip("|").split("|")[0]
        for name in re.findall(r"`([^`]+)`", first):
            tables[-1].add(LOCK + name[3:] if name.startswith("...") else name)
    return tables


def kind_of(table: set[str]) -> str:
    """The kind of primitive a table is about, by its queue's name."""
    if any(":queue:semaphore" in name for name in table):
        return "semaphore"
    if any(":queue:rw" in name for name in table):
        return "rw"
    return "lock"


@pytest.mark.parametrize(
    ("page", "kinds"),
    [("semantics.md", ["lock", "semaphore", "rw"]), ("server-queue.md", ["lock"])],
)
def test_each_key_table_names_the_keys_the_code_builds(page: str, kinds: list[str]) -> None:
    """A table of keys for a kind names every key the code builds for it, and no other."""
    tables = key_tables(page)
    assert [kind_of(table) for table in tables] == kinds
    for table in tables:
        assert table == built(kind_of(table)), (page, kind_of(table))


def test_no_other_page_lists_the_keys_again() -> None:
    """Only the semantics and server-queue pages hold key tables; the others point there."""
    pages = {p.name for p in (ROOT / "docs").glob("*.md") if key_tables(p.name)}
    assert pages == {"semantics.md", "server-queue.md"}


def test_the_check_sees_a_missing_or_a_made_up_key() -> None:
    """A table that lost a key, or names one the code does not build, is told apart."""
    table = built("lock")
    assert table - {LOCK + ":fence"} != built("lock")
    assert table | {LOCK + ":waiters"} != built("lock")
    assert kind_of(built("semaphore")) == "semaphore"
    assert kind_of(built("rw")) == "rw"
