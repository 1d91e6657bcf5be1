"""The Lua scripts that make each lock operation one atomic round trip.

Each script is a :class:`Script`: its text and its SHA1, computed once.
:class:`aiolock._wire.Wire` calls them by SHA (``EVALSHA``) and loads them
again on ``NOSCRIPT`` (after a server restart or ``SCRIPT FLUSH``). Values
reach Lua only through ``KEYS`` and ``ARGV``; no script text is ever built by
formatting.

All keys one script touches share the lock's hash slot: the lock key is
``<prefix>{<name>}`` and its companions append a suffix after the ``}``.

The queue between processes (DESIGN.md §3.4) is a list of tokens,
``KEYS[2]``, and one key per waiter, its *entry*, ``KEYS[2] .. ':' ..
token``, whose value is the lease a grant gives it, the number of the
attempt that wrote it and the tag of its process's grant channel
(``'<ms> <n> <tag>'``, or ``'<ms>f <n> <tag>'`` when it wants a fence; a
waiter without notifications leaves the tag out). An entry lives while its waiter
refreshes it (``PEXPIRE``); a token in the list whose entry is gone is a
dead waiter's, and is dropped when met. Entry keys are the only keys a
script names without ``KEYS``: a releaser cannot know the next waiter's
token before it reads the list. They share the lock's slot, which Redis and
Valkey clusters allow.

Every script that frees the lock hands it instead to the first live waiter
of the queue (``grant_next``): the key takes that waiter's token with the
lease its entry asks for, and ``g <token> <ms> <fence> <n>`` goes out on
the grant channel its entry names, ``<channel>:<tag>``, which only the
heir's process listens to: it wakes that waiter alone, and no other process
reads it. If nobody listens there (the heir's process died, or its
pub/sub connection is down), or the entry names no channel, the grant goes
out on the lock's channel instead, where every waiter hears it: the next
in line then knows that the heir's first lease bounds its wait. ``<n>`` tells the waiter
which of its entries was granted: a grant it missed, whose lease ran out
before it queued again, is not taken for the grant of its new entry. Only with nobody queued is
the key deleted and an empty message published (which wakes every waiter
of the channel, as before the queue).
"""

from __future__ import annotations

import hashlib
from typing import final

__all__ = ["ACQUIRE", "EXTEND", "HANDOVER", "LEAVE", "QUEUE_SLACK_MS", "RELEASE", "Script"]


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


#: How long the queue outlives the lease of the lock it was last extended with (ms).
#: More than an entry's life: a waiter that watches the holder's lease acts well before.
QUEUE_SLACK_MS = 2500

# The next fence of a lock (KEYS[3] of every script that can take or grant the
# lock): one more than the last, and never below the server's clock in microseconds. The floor keeps
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

# Best-effort announcements, and the grant rule every script that frees the lock
# follows. KEYS[1] the lock, KEYS[2] the queue, KEYS[3] the fencing counter.
_GRANT = (
    _NEXT_FENCE
    + """
local function announce(channel, sharded, payload)
    local heard
    if sharded == '1' then
        heard = redis.pcall('SPUBLISH', channel, payload)
    else
        heard = redis.pcall('PUBLISH', channel, payload)
    end
    if type(heard) == 'number' then
        return heard
    end
    return 0
end

local function grant_next(channel, sharded)
    while true do
        local heir = redis.call('LPOP', KEYS[2])
        if not heir then
            return false
        end
        local wants = redis.call('GETDEL', KEYS[2] .. ':' .. heir)
        if wants then
            local ms, fenced, written, tag = string.match(wants, '^(%d+)(f?) (%d+) ?(%w*)$')
            redis.call('SET', KEYS[1], heir, 'PX', ms)
            redis.call('PEXPIRE', KEYS[2], tonumber(ms) + """
    + str(QUEUE_SLACK_MS)
    + """)
            local fence = 0
            if fenced == 'f' then
                fence = next_fence(KEYS[3])
            end
            local message = 'g ' .. heir .. ' ' .. ms .. ' ' .. string.format('%d', fence)
            message = message .. ' ' .. written
            if tag == '' or announce(channel .. ':' .. tag, sharded, message) == 0 then
                announce(channel, sharded, message)
            end
            return tonumber(ms)
        end
    end
end
"""
)

# ACQUIRE (an attempt; a waiter's attempt also puts it in the queue)
#   KEYS[1]  the lock key
#   KEYS[2]  the queue
#   KEYS[3]  the fencing counter (touched only with fencing, or for a fencing heir)
#   ARGV[1]  the token
#   ARGV[2]  the lease in milliseconds
#   ARGV[3]  the entry to queue with if the lock is not taken ('<ms> <n> <tag>' or
#            '<ms>f <n> <tag>': the lease a grant gives, whether it wants a fence, the
#            number of this attempt, and the tag of the channel its grant goes to,
#            which may be left out with its space); '' to not queue
#   ARGV[4]  the entry's life in milliseconds
#   ARGV[5]  '1' if the caller may be queued already (or even granted the lock)
#   ARGV[6]  '1' with fencing
#   ARGV[7]  the lock's channel
#   ARGV[8]  '1' on a cluster (sharded pub/sub)
# Returns {1, fence} when the caller holds the lock now (fence 0 without fencing):
# it was granted it (its lease starts again), or the lock was free and nobody
# alive was queued before it. Otherwise {0, pttl}: the holder's remaining lease in
# ms (-1: no expiry); a free lock with a live waiter queued first is granted to
# that waiter (pttl is then its lease). Unless ARGV[3] is '', the caller is then
# in the queue, once; its entry lives ARGV[4] ms. A queue it makes (or may have
# lost) is kept for the holder's lease plus the slack; a queue that was there
# already is kept by whatever gave the holder its lease (a grant, a hand-over, a
# renewal each extend it).
ACQUIRE = Script(
    _GRANT
    + """
local mine = KEYS[2] .. ':' .. ARGV[1]
local function taken()
    if ARGV[6] == '1' then
        return {1, next_fence(KEYS[3])}
    end
    return {1, 0}
end
if ARGV[5] == '1' and redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('DEL', mine)
    return taken()
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
    local head = redis.call('LINDEX', KEYS[2], 0)
    while head and head ~= ARGV[1] and redis.call('EXISTS', KEYS[2] .. ':' .. head) == 0 do
        redis.call('LPOP', KEYS[2])
        head = redis.call('LINDEX', KEYS[2], 0)
    end
    if not head or head == ARGV[1] then
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
        if head then
            redis.call('LPOP', KEYS[2])
            redis.call('DEL', mine)
            redis.call('PEXPIRE', KEYS[2], ARGV[2] + """
    + str(QUEUE_SLACK_MS)
    + """)
        end
        return taken()
    end
    pttl = grant_next(ARGV[7], ARGV[8])
end
if ARGV[3] ~= '' then
    local had = redis.call('SET', mine, ARGV[3], 'PX', ARGV[4], 'GET')
    local length = 0
    if not had or (ARGV[5] == '1' and not redis.call('LPOS', KEYS[2], ARGV[1])) then
        length = redis.call('RPUSH', KEYS[2], ARGV[1])
    end
    if length == 1 or ARGV[5] == '1' then
        local life = pttl
        if life < 0 then
            life = 0
        end
        redis.call('PEXPIRE', KEYS[2], life + """
    + str(QUEUE_SLACK_MS)
    + """)
    end
end
return {0, pttl}
"""
)

# LEAVE (a waiter that gives up: cancelled, timed out, failed; also the undo of an attempt)
#   KEYS[1]  the lock key
#   KEYS[2]  the queue
#   KEYS[3]  the fencing counter (for a fencing heir)
#   ARGV[1]  the waiter's token
#   ARGV[2]  the lock's channel
#   ARGV[3]  '1' on a cluster (sharded pub/sub)
# Takes the waiter out of the queue. If the lock holds its token (a grant, or an
# attempt, that raced the giving up), frees it by the grant rule, so the next
# waiter gets it. Returns 1 if the lock held the token, else 0.
LEAVE = Script(
    _GRANT
    + """
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('DEL', KEYS[2] .. ':' .. ARGV[1])
if redis.call('GET', KEYS[1]) == ARGV[1] then
    if not grant_next(ARGV[2], ARGV[3]) then
        redis.call('DEL', KEYS[1])
        announce(ARGV[2], ARGV[3], '')
    end
    return 1
end
return 0
"""
)

# RELEASE
#   KEYS[1]  the lock key
#   KEYS[2]  the queue
#   KEYS[3]  the fencing counter (for a fencing heir)
#   ARGV[1]  the holder's token
#   ARGV[2]  the lock's channel
#   ARGV[3]  '1' on a cluster (sharded pub/sub)
# If the key holds the token: hands the lock to the first live waiter of the queue
# and returns 2; with nobody queued, deletes the key, announces the release and
# returns 1. Returns 0 (touching nothing) if the key was not ours. The
# announcements are best effort (redis.pcall): a server that refuses them (a user
# without channel rights, a server without SPUBLISH) must not turn a release into
# an error; waiters then find their grant, or the free lock, when they check.
RELEASE = Script(
    _GRANT
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
if grant_next(ARGV[2], ARGV[3]) then
    return 2
end
redis.call('DEL', KEYS[1])
announce(ARGV[2], ARGV[3], '')
return 1
"""
)

# EXTEND
#   KEYS[1]  the lock key
#   KEYS[2]  the queue
#   ARGV[1]  the holder's token
#   ARGV[2]  the new lease in milliseconds
# Resets the lease only if the key still holds the token, and keeps the queue (if
# any) for that long plus its slack. Returns 1 if it did, 0 if the key is gone or
# belongs to someone else.
EXTEND = Script(
    """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[2], ARGV[2] + """
    + str(QUEUE_SLACK_MS)
    + """)
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
)


# HANDOVER (a release straight to the next waiter of the same process)
#   KEYS[1]  the lock key
#   KEYS[2]  the queue
#   KEYS[3]  the fencing counter
#   ARGV[1]  the releasing holder's token
#   ARGV[2]  the next holder's token
#   ARGV[3]  the next holder's lease in milliseconds
#   ARGV[4]  the lock's channel
#   ARGV[5]  '1' on a cluster (sharded pub/sub)
#   ARGV[6]  '1' if the lock should go to the queue's first live waiter, if there is one
#   ARGV[7]  '1' if the next holder fences
# Returns {0, 0} if the key was not the releaser's (nothing is touched); {2, ms}
# if it went to the queue's first live waiter instead (ARGV[6]; ms: its lease);
# otherwise {1, fence}: the key now holds the next holder's token and lease (fence
# as in ACQUIRE). The queue is not touched without ARGV[6]: a local run looks at
# it after LOCAL_RUN (0.1 s) at the latest, and whatever began the run (a grant,
# a queued attempt) left it at least QUEUE_SLACK_MS to live.
HANDOVER = Script(
    _GRANT
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {0, 0}
end
if ARGV[6] == '1' then
    local granted = grant_next(ARGV[4], ARGV[5])
    if granted then
        return {2, granted}
    end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[7] == '1' then
    return {1, next_fence(KEYS[3])}
end
return {1, 0}
"""
)
