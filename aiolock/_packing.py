"""Commands in the RESP protocol as redis-py's ``pack_command`` makes them, packed in C or one join.

redis-py's asyncio connections pack a command in Python, copying a growing
buffer at every argument; a renewal of a hundred holdings has hundreds.
:func:`packed` packs the arguments aiolock sends (str, bytes, int) with
hiredis in C where the client's encoding is UTF-8, and otherwise in one
join; anything else is left to redis-py (None). A connection class of the
application's own that overrides ``pack_command`` keeps its packing.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from typing import Any, Final

from redis.asyncio.connection import Connection as RedisConnection

__all__ = ["HIREDIS_PACK", "REDIS_PACK", "packed"]

try:  # hiredis packs in C (redis-py's asyncio connections do not use it)
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - redis-py without hiredis
    HIREDIS_PACK: Callable[[tuple[Any, ...]], bytes] | None = None
else:
    HIREDIS_PACK = _hiredis_pack
#: What hiredis packs as redis-py would (not float: the two write some differently).
_HIREDIS_KINDS: Final = frozenset((str, bytes, int))
#: The encoding names hiredis writes str in.
_UTF8: Final = frozenset(("utf-8", "utf8", "UTF-8", "UTF8"))

#: redis-py's own packing: a connection class that overrides it (to record, say) keeps it.
REDIS_PACK: Final = RedisConnection.pack_command


def packed(args: tuple[Any, ...], encoding: str, errors: str) -> list[bytes] | None:
    """``args`` in the RESP protocol, as redis-py's ``pack_command`` makes it; None to let it.

    With hiredis, in C, for str (UTF-8), bytes and int. Otherwise one join,
    where redis-py copies its growing buffer at every argument: a renewal of
    a hundred holdings has hundreds. Only str (in the client's
    encoding), bytes and int; anything else is redis-py's to encode. Where
    the encoding writes ASCII as ASCII, ASCII text and numbers are joined as
    text and encoded once, not encoded one by one.
    """
    first = args[0]
    if first.__class__ is not str:
        return None
    if (
        HIREDIS_PACK is not None
        and errors == "strict"
        and encoding in _UTF8
        and _HIREDIS_KINDS.issuperset(map(type, args))  # (in C: no Python step per argument)
    ):
        if " " in first:
            args = (*first.split(), *args[1:])
        return [HIREDIS_PACK(args)]
    text = _ASCII_SAFE.get(encoding)
    if text is None:
        text = _ASCII_SAFE[encoding] = _writes_ascii_as_ascii(encoding)
    words = first.split()
    pieces = [f"*{len(words) + len(args) - 1}\r\n"]
    pieces += [f"${len(word)}\r\n{word}\r\n" for word in words]
    parts: list[bytes] = []
    for arg in args[1:]:
        kind = arg.__class__
        if kind is int:
            digits = int.__repr__(arg)
            pieces.append(f"${len(digits)}\r\n{digits}\r\n")
            continue
        if kind is str and text and arg.isascii():
            pieces.append(f"${len(arg)}\r\n{arg}\r\n")
            continue
        if kind is str:
            data = arg.encode(encoding, errors)
        elif kind is bytes:
            data = arg
        else:
            return None
        if pieces:
            parts.append("".join(pieces).encode())
            pieces = []
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    if pieces:
        parts.append("".join(pieces).encode())
    return [b"".join(parts)]


#: Per encoding name: whether it writes ASCII text as the same bytes.
_ASCII_SAFE: dict[str, bool] = {}


def _writes_ascii_as_ascii(encoding: str) -> bool:
    try:
        return codecs.lookup(encoding).name in {"utf-8", "ascii", "iso8859-1", "cp1252"}
    except LookupError:
        return False
