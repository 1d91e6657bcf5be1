"""The Lua scripts that make each lock operation one atomic round trip.

Each script is a :class:`Script`: its text and its SHA1, computed once.
:class:`aiolock._wire.Wire` calls them by SHA (``EVALSHA``) and loads them
again on ``NOSCRIPT`` (after a server restart or ``SCRIPT FLUSH``). Values
reach Lua only through ``KEYS`` and ``ARGV``; no script text is ever built by
formatting.

All keys one script touches share the lock's hash slot: the lock key is
``<prefix>{<name>}`` and its companions append a suffix after the ``}``.
"""

from __future__ import annotations

import hashlib
from typing import final

__all__ = ["ACQUIRE", "EXTEND", "HANDOVER", "RELEASE", "UNMARK", "Script"]


@final
class Script:
    """A Lua script and its SHA1, the name ``EVALSHA`` calls it by."""

    __slots__ = ("sha", "text")

    def __init__(self, text: str) -> None:
        #: The Lua source.
        self.text = text
        #: Its SHA1 in hex, as ``SCRIPT LOAD`` returns it.
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()

    def __repr__(self) -> str:
        return f"<Script {self.sha[:12]}>"


# The next fence of a lock (KEYS[3] of ACQUIRE and HANDOVER): one more than the
# last, and never below the server's clock in microseconds. The floor keeps
# fences increasing across a restart that lost the counter (no persistence, or
# a failover to a replica without it): otherwise the first holder after the
# restart would get fence 1 while a stale holder from before still writes with
# a higher one, or get the very fence a stale holder uses. It assumes the
# server's clock does not go back across a restart by more than the fences
# advanced, and fewer than a million fences per second.
_NEXT_FENCE = """
local function next_fence(key)
    local fence = redis.call('INCR', key)
    local now = redis.call('TIME')
    local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
    if fence < floor then
        redis.call('SET', key, string.format('%d', floor))
        return floor
    end
    return fence
end
"""

# ACQUIRE
#   KEYS[1]  the lock key
#   KEYS[2]  the waiting marker: present while someone elsewhere waits
#   KEYS[3]  (only with fencing) the fencing counter
#   ARGV[1]  the new holder's token
#   ARGV[2]  the lease in milliseconds
#   ARGV[3]  the waiter's id (one per acquisition; '' when it will not wait)
#   ARGV[4]  how long the marker must last if the attempt fails, in ms ('0': no marker)
# Returns {1, fence} when the lock was taken (fence is 0 without KEYS[3]),
# or {0, pttl} when someone holds it (pttl as PTTL reports it: the remaining
# lease in ms, -1 for a key without expiry, -2 if it vanished meanwhile).
# A failed attempt that will wait sets the marker to the waiter's id; a
# successful one deletes the marker if the waiter was the last to set it (a
# marker set since by another waiter is theirs to keep up).
ACQUIRE = Script(
    _NEXT_FENCE
    + """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then
        redis.call('DEL', KEYS[2])
    end
    if KEYS[3] then
        return {1, next_fence(KEYS[3])}
    end
    return {1, 0}
end
if ARGV[4] ~= '0' then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
end
return {0, redis.call('PTTL', KEYS[1])}
"""
)

# UNMARK (a waiter that gives up)
#   KEYS[1]  the waiting marker
#   ARGV[1]  the waiter's id
# Deletes the marker if this waiter was the last to set it. Returns 1 if it did.
UNMARK = Script(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""
)

# RELEASE
#   KEYS[1]  the lock key
#   ARGV[1]  the holder's token
#   ARGV[2]  the release channel
#   ARGV[3]  '1' to announce with SPUBLISH (cluster), anything else: PUBLISH
# Deletes the key only if it still holds the token, then announces the
# release. Returns 1 if it deleted the key, 0 if the key was not ours.
# The announcement is best effort (redis.pcall): a server that refuses it (a
# user without channel rights, a server without SPUBLISH) must not turn a
# release that deleted the key into an error; waiters then poll.
RELEASE = Script(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    if ARGV[3] == '1' then
        redis.pcall('SPUBLISH', ARGV[2], '')
    else
        redis.pcall('PUBLISH', ARGV[2], '')
    end
    return 1
end
return 0
"""
)

# EXTEND
#   KEYS[1]  the lock key
#   ARGV[1]  the holder's token
#   ARGV[2]  the new lease in milliseconds
# Resets the lease only if the key still holds the token. Returns 1 if it
# did, 0 if the key is gone or belongs to someone else.
EXTEND = Script(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
)


# HANDOVER (a release straight to the next waiter of the same process)
#   KEYS[1]  the lock key
#   KEYS[2]  the waiting marker (see ACQUIRE)
#   KEYS[3]  (only if the next holder uses fencing) the fencing counter
#   ARGV[1]  the releasing holder's token
#   ARGV[2]  the next holder's token
#   ARGV[3]  the next holder's lease in milliseconds
#   ARGV[4]  the release channel
#   ARGV[5]  '1' on a cluster (sharded pub/sub), anything else: classic pub/sub
#   ARGV[6]  how many subscribers of the channel are the releaser's own process
#   ARGV[7]  '1' if the releaser should let waiters elsewhere go first
# Returns {0, 0} if the key was not the releaser's (nothing is touched);
# {2, marker} if it released the key and announced it, because ARGV[7] is '1'
# and someone elsewhere waits for the lock: more than ARGV[6] subscribers
# listen on the channel (they come at once: `marker` is -2), or else a waiter
# that polls raised the marker (`marker` is its PTTL in ms: when that waiter
# tries next, plus the slack); otherwise {1, fence}: the key now holds the next
# holder's token and lease (fence as in ACQUIRE). Counting and announcing are
# best effort, as in RELEASE: a refused count counts no listener.
HANDOVER = Script(
    _NEXT_FENCE
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {0, 0}
end
if ARGV[7] == '1' then
    local counted
    if ARGV[5] == '1' then
        counted = redis.pcall('PUBSUB', 'SHARDNUMSUB', ARGV[4])
    else
        counted = redis.pcall('PUBSUB', 'NUMSUB', ARGV[4])
    end
    local listening = 0
    if type(counted) == 'table' and not counted.err then
        listening = counted[2]
    end
    local marker = -2
    if listening <= tonumber(ARGV[6]) then
        marker = redis.call('PTTL', KEYS[2])
    end
    if listening > tonumber(ARGV[6]) or marker ~= -2 then
        redis.call('DEL', KEYS[1])
        if ARGV[5] == '1' then
            redis.pcall('SPUBLISH', ARGV[4], '')
        else
            redis.pcall('PUBLISH', ARGV[4], '')
        end
        return {2, marker}
    end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if KEYS[3] then
    return {1, next_fence(KEYS[3])}
end
return {1, 0}
"""
)
