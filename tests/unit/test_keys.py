"""The names of a lock's keys: the fence's and the channel's are made at their first read."""

from __future__ import annotations

import sys

import pytest

from aiolock._keys import Keys, keys_for


def test_the_fence_and_the_channel_are_named_after_the_lock_key() -> None:
    """Read once or twice, they are the lock key with their suffix, and the same object."""
    keys = Keys("job", "app:")
    assert keys.lock == "app:{job}"
    assert keys.channel == "app:{job}:released"
    assert keys.fence == "app:{job}:fence"
    assert keys.channel is keys.channel
    assert keys.fence is keys.fence


def test_the_lazy_names_cost_nothing_until_read() -> None:
    """A Keys never asked for them holds no string for them (held locks need neither)."""
    read, unread = Keys("a"), Keys("b")
    assert read.channel
    assert read.fence
    assert sys.getsizeof(read) == sys.getsizeof(unread)  # (slots: a pointer each either way)
    with pytest.raises(AttributeError):
        object.__getattribute__(unread, "channel")  # (unset until read)
    assert unread.channel == "aiolock:{b}:released"


def test_any_other_missing_attribute_is_an_attribute_error() -> None:
    """Only the two lazy names are made; hasattr and getattr keep their meaning."""
    keys = keys_for("c")
    assert not hasattr(keys, "nothing")
    assert getattr(keys, "nothing", None) is None
    with pytest.raises(AttributeError, match="'Keys' object has no attribute 'queues'"):
        getattr(keys, "queues")  # noqa: B009 - a name the type checker would refuse
