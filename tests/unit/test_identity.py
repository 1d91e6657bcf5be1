"""The identity in a token: minted, read back, and the default's cache (no server)."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from aiolock import _identity
from aiolock._identity import (
    UNKNOWN,
    default_encoded,
    encode_identity,
    identity_of,
    marks_of,
    mint,
    minted_at,
)

HERE = f"{socket.gethostname()}:{os.getpid()}:"


def test_a_minted_token_carries_its_time_marks_and_identity() -> None:
    """mint → minted_at (ms, this clock), marks_of, identity_of (spaces and % survive)."""
    before = time.time()
    token = mint(encode_identity("worker 7 (50%)"), "fe")
    after = time.time()
    assert " " not in token
    head = token.partition(":")[0]
    assert len(head) == 44 + 2
    assert int(head[:44], 16) >= 0
    at = minted_at(token)
    assert at is not None
    assert before - 0.001 <= at <= after + 0.001
    assert marks_of(token) == "fe"
    assert identity_of(token) == "worker 7 (50%)"
    assert identity_of(token.encode()) == "worker 7 (50%)"
    assert mint(None) != mint(None)  # 128 fresh random bits each


def test_an_older_token_reads_as_no_time_no_marks() -> None:
    """A bare 32-hex token (or an old election's) has no time, no marks, maybe no identity."""
    old = os.urandom(16).hex()
    assert (minted_at(old), marks_of(old), identity_of(old)) == (None, "", None)
    election = f"{old}:cand"
    assert (minted_at(election), marks_of(election), identity_of(election)) == (None, "", "cand")
    assert minted_at(None) is None
    assert UNKNOWN == "unknown"


async def test_the_default_is_each_task_s_own_name_even_when_tasks_alternate() -> None:
    """The cache per task name never gives a task another task's name."""

    async def named() -> str:
        return default_encoded(asyncio.current_task())

    seen = [await asyncio.create_task(named(), name=n) for n in ["a", "b", "a", "b b"]]
    assert seen == [f"{HERE}a", f"{HERE}b", f"{HERE}a", encode_identity(f"{HERE}b b")]
    assert default_encoded(None) == encode_identity(f"{HERE}-")


async def test_the_cache_of_defaults_is_bounded() -> None:
    """A task name per request does not grow the cache past DEFAULTS_MOST names."""

    async def named() -> str:
        return default_encoded(asyncio.current_task())

    for n in range(_identity.DEFAULTS_MOST + 10):
        assert await asyncio.create_task(named(), name=f"req-{n}") == f"{HERE}req-{n}"
        assert len(_identity.DEFAULTS) <= _identity.DEFAULTS_MOST
    assert len(_identity.DEFAULTS) < _identity.DEFAULTS_MOST


def test_a_forked_child_makes_its_default_again() -> None:
    """After a fork the host:pid part and the cached identities are forgotten."""
    default_encoded(None)
    assert "-" in _identity.DEFAULTS
    _identity._forked()
    assert _identity._host_pid is None
    assert not _identity.DEFAULTS
    assert default_encoded(None) == encode_identity(f"{HERE}-")


@pytest.mark.parametrize("name", ["x" * 300, "tab\there"])
async def test_a_task_name_too_long_or_unprintable_still_makes_an_identity(name: str) -> None:
    """The default is cut to 256 characters and unprintables replaced: never refused."""

    async def named() -> str:
        return default_encoded(asyncio.current_task())

    identity = identity_of(f"{'0' * 44}:{await asyncio.create_task(named(), name=name)}")
    assert identity is not None
    assert len(identity) <= 256
    assert identity.isprintable()
    assert identity.startswith(HERE)
