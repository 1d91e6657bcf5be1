"""The Lua scripts that make each lock operation one atomic round trip.

Each script is a :class:`Script`: its text and its SHA1, computed once.
:class:`aiolock._wire.Wire` calls them by SHA (``EVALSHA``) and loads them
again on ``NOSCRIPT`` (after a server restart or ``SCRIPT FLUSH``). Values
reach Lua only through ``KEYS`` and ``ARGV``; no script text is ever built by
formatting.

All keys one script touches share the lock's hash slot: the lock key is
``<prefix>{<name>}`` and its companions append a suffix after the ``}``.

The queue between processes (``docs/server-queue.md``) is a list of tokens,
``KEYS[2]``, and one key per waiter, its *entry*, ``KEYS[2] .. ':' ..
token``, whose value is the lease a grant gives it, the number of the
attempt that wrote it and the tag of its process's grant channel
(``'<ms> <n> <tag>'``, or ``'<ms>f <n> <tag>'`` when it wants a fence, and
``'<ms>r ...'``, ``'<ms>w ...'`` for a reader's and a writer's; a waiter
without notifications leaves the tag out). An entry lives while its waiter
refreshes it (``PEXPIRE``); a token in the list whose entry is gone is a
dead waiter's, and is dropped when met. A *kept* entry ends with the id of
its client's keeper (``'<ms> <n> <tag> <id>'``, see :mod:`aiolock._keeper`):
it is alive while the keeper's mark ``KEYS[2] .. ':@' .. id`` exists, which
``KEEP`` sets again for all the keeper's waiters at once; past it, it is a
dead waiter's, deleted when met. Entry keys are the only keys a
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

__all__ = [
    "ACQUIRE",
    "EXTEND",
    "EXTEND_MANY",
    "HANDOVER",
    "KEEP",
    "KEEPER_MARK_MS",
    "LEAVE",
    "QUEUE_SLACK_MS",
    "RELEASE",
    "RW_ACQUIRE",
    "RW_EXTEND",
    "RW_EXTEND_MANY",
    "RW_INDEX_SUFFIX",
    "RW_LEAVE",
    "RW_RELEASE",
    "RW_STATE",
    "SEMAPHORE_ACQUIRE",
    "SEMAPHORE_EXTEND",
    "SEMAPHORE_EXTEND_MANY",
    "SEMAPHORE_HANDOVER",
    "SEMAPHORE_LEAVE",
    "SEMAPHORE_RELEASE",
    "SEMAPHORE_STATE",
    "Script",
]


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
#: How long a keeper's mark lives unless its keeper sets it again (ms): as long as a
#: waiter's own entry lives (``aiolock._lease.ENTRY_CAP``).
KEEPER_MARK_MS = 2000

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

# Best-effort announcements, and how a grant is made known. KEYS[2] is the queue.
_TELL = """
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

-- Read an entry's value: the first lease a grant gives its waiter (ms), its letter ('f':
-- a lock waiter that wants a fence; 'r', 'w': a reader's, a writer's; '' else), the
-- number of the attempt that wrote it, the tag of its grant channel and the id of the
-- keeper that keeps it alive ('': its waiter's own refreshes); nil if unreadable.
local function parse_entry(wants)
    return string.match(wants, '^(%d+)(%a?) (%d+) ?(%w*) ?(%w*)$')
end

-- Read the entry at `key` (GETDEL when `take`, else GET) as parse_entry reads it, less
-- its keeper; nil if it is gone, unreadable, or kept by a keeper whose mark has expired
-- (its process stopped keeping it: a dead waiter, whose entry is then deleted).
local function read_entry(key, take)
    local wants
    if take then
        wants = redis.call('GETDEL', key)
    else
        wants = redis.call('GET', key)
    end
    if not wants then
        return nil
    end
    local ms, letter, written, tag, keeper = parse_entry(wants)
    if keeper and keeper ~= '' and redis.call('EXISTS', KEYS[2] .. ':@' .. keeper) == 0 then
        if not take then
            redis.call('DEL', key)
        end
        return nil
    end
    return ms, letter, written, tag
end

-- Take the entry of the queued waiter `heir` (GETDEL), read as read_entry reads it;
-- nil if it is gone (a dead waiter) or unreadable.
local function take_entry(heir)
    return read_entry(KEYS[2] .. ':' .. heir, true)
end

-- Tell `heir` of its grant: on its process's grant channel, or, if nobody listens
-- there (or its entry names none), on the lock's channel, where every waiter hears it.
local function tell(channel, sharded, heir, ms, fence, written, tag)
    local message = 'g ' .. heir .. ' ' .. ms .. ' ' .. string.format('%d', fence)
    message = message .. ' ' .. written
    if tag == '' or announce(channel .. ':' .. tag, sharded, message) == 0 then
        announce(channel, sharded, message)
    end
end
"""

# The grant rule every lock script that frees the lock follows. KEYS[1] the lock,
# KEYS[2] the queue, KEYS[3] the fencing counter.
_GRANT = (
    _NEXT_FENCE
    + _TELL
    + """
local function grant_next(channel, sharded)
    while true do
        local heir = redis.call('LPOP', KEYS[2])
        if not heir then
            return false
        end
        local ms, fenced, written, tag = take_entry(heir)
        if ms then
            redis.call('SET', KEYS[1], heir, 'PX', ms)
            redis.call('PEXPIRE', KEYS[2], tonumber(ms) + """
    + str(QUEUE_SLACK_MS)
    + """)
            local fence = 0
            if fenced == 'f' then
                fence = next_fence(KEYS[3])
            end
            tell(channel, sharded, heir, ms, fence, written, tag)
            return tonumber(ms)
        end
    end
end
"""
)

# Put the caller in the queue (an attempt that failed), once: ACQUIRE's ARGV[1], [3],
# [4] and [5] (see ACQUIRE), `mine` its entry, `pttl` how long the holders' leases run
# (a queue it makes lives that long plus its slack; nil: the key's PTTL).
_QUEUE_UP = (
    """
local function queue_up(mine, pttl)
    if ARGV[3] == '' then
        return
    end
    local had = redis.call('SET', mine, ARGV[3], 'PX', ARGV[4], 'GET')
    local _, _, _, _, keeper = parse_entry(ARGV[3])
    if keeper and keeper ~= '' then
        -- Kept by its client's keeper: alive while the keeper's mark is.
        redis.call('SET', KEYS[2] .. ':@' .. keeper, '1', 'PX', """
    + str(KEEPER_MARK_MS)
    + """)
    end
    local length = 0
    -- (A call's first entry: not queued yet. Later: queued unless the list lost it.)
    local queued = had
    if ARGV[5] == '1' then
        queued = redis.call('LPOS', KEYS[2], ARGV[1])
    end
    if not queued then
        length = redis.call('RPUSH', KEYS[2], ARGV[1])
    end
    if length == 1 or ARGV[5] == '1' then
        local life = pttl
        if life == nil then
            life = redis.call('PTTL', KEYS[1])
        end
        if life < 0 then
            life = 0
        end
        redis.call('PEXPIRE', KEYS[2], life + """
    + str(QUEUE_SLACK_MS)
    + """)
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
#   ARGV[5]  what to look at first: '1' the caller may be queued already (or even
#            granted the lock): the key and the queue; '2' the key (its kind, and
#            whether it holds the token already); '0' nothing (the key is known to be
#            a lock's and someone else's)
#   ARGV[6]  '1' with fencing
#   ARGV[7]  the lock's channel
#   ARGV[8]  '1' on a cluster (sharded pub/sub)
# Returns {1, fence} when the caller holds the lock now (fence 0 without fencing):
# the key holds its token already (a grant, or an earlier run of this very attempt
# whose reply was lost: its lease starts again), or the lock was free and nobody
# alive was queued before it. Run twice, it answers the same. Otherwise {0, pttl}:
# the holder's remaining lease in ms (-1: no expiry); a free lock with a live
# waiter queued first is granted to that waiter (pttl is then its lease). Unless
# ARGV[3] is '', the caller is then in the queue, once; its entry lives ARGV[4] ms.
# A queue it makes (or may have lost) is kept for the holder's lease plus the
# slack; a queue that was there already is kept by whatever gave the holder its
# lease (a grant, a hand-over, a renewal each extend it).
ACQUIRE = Script(
    _GRANT
    + _QUEUE_UP
    + """
local mine = KEYS[2] .. ':' .. ARGV[1]
local function taken()
    if ARGV[6] == '1' then
        return {1, next_fence(KEYS[3])}
    end
    return {1, 0}
end
-- (GET fails with WRONGTYPE where the name is another kind's: the caller is told at once.)
if ARGV[5] ~= '0' and redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('DEL', mine)
    return taken()
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
    local head = redis.call('LINDEX', KEYS[2], 0)
    while head and head ~= ARGV[1] and not read_entry(KEYS[2] .. ':' .. head, false) do
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
    -- (Nobody granted: only unreadable entries were queued. Then attempt again.)
    pttl = grant_next(ARGV[7], ARGV[8]) or -2
end
queue_up(mine, pttl)
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

# KEEP (a client's waiters on one name, kept alive together by its keeper)
#   KEYS[1]  the queue
#   ARGV[1]  the keeper's id
#   ARGV[2]  how many tokens follow whose entries to delete (their calls ended)
#   ARGV[3]  how many tokens follow those whose entries to extend by ARGV[4] ms
#   ARGV[4]  a kept entry's own life (ms)
#   then the tokens of the entries only to look at
# Sets the keeper's mark (its entries are alive while it lives) for KEEPER_MARK_MS,
# deletes the first entries, extends the next, and looks at the rest. Returns, for
# each token extended or looked at, in order, 1 if its entry is there, else 0 (gone:
# granted, or lost). One MGET looks at all: the cost does not grow with the waiters.
KEEP = Script(
    """
local queue = KEYS[1]
redis.call('SET', queue .. ':@' .. ARGV[1], '1', 'PX', """
    + str(KEEPER_MARK_MS)
    + """)
local drop = tonumber(ARGV[2])
local extend = tonumber(ARGV[3])
local first = 5
if drop > 0 then
    local doomed = {}
    for i = first, first + drop - 1 do
        doomed[#doomed + 1] = queue .. ':' .. ARGV[i]
    end
    redis.call('DEL', unpack(doomed))
end
first = first + drop
local found = {}
for i = first, first + extend - 1 do
    found[#found + 1] = redis.call('PEXPIRE', queue .. ':' .. ARGV[i], ARGV[4])
end
first = first + extend
if first <= #ARGV then
    local looked = {}
    for i = first, #ARGV do
        looked[#looked + 1] = queue .. ':' .. ARGV[i]
    end
    for _, value in ipairs(redis.call('MGET', unpack(looked))) do
        found[#found + 1] = value and 1 or 0
    end
end
return found
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
#   ARGV[1]  the holder's token
#   ARGV[2]  the new lease in milliseconds
#   ARGV[3]  the queue's name (not a declared key: see below)
# Resets the lease only if the key still holds the token, and keeps the queue (if
# any) for that long plus its slack. Returns 1 if it did, 0 if the key is gone or
# belongs to someone else. The extend scripts declare the lock's key alone: while
# a cluster migrates the slot, a script whose declared keys are split between the
# two nodes is refused (TRYAGAIN), and a renewal must go on through a migration
# longer than a lease. The queue is only ever extended here, never made, so it
# cannot appear on the wrong node; while the slot migrates the server refuses the
# queue's PEXPIRE (a key that may not be local), and it is skipped (redis.pcall).
#
# Each kind's extend is a Lua function, ``extend(key, token, ms, queue)``, run by a
# script for one holding (the arguments above) and by one for many (:func:`_many`).
_EXTEND_LOCK = (
    """
local function extend(key, token, ms, queue)
    if redis.call('GET', key) == token then
        redis.pcall('PEXPIRE', queue, tonumber(ms) + """
    + str(QUEUE_SLACK_MS)
    + """)
        return redis.call('PEXPIRE', key, ms)
    end
    return 0
end
"""
)


def _one(extend: str) -> Script:
    """The script that extends one holding with the function ``extend`` (EXTEND's arguments)."""
    return Script(extend + "return extend(KEYS[1], ARGV[1], ARGV[2], ARGV[3])\n")


def _many(extend: str) -> Script:
    """The script that extends many holdings of one slot with the function ``extend``.

    ``KEYS[i]`` is the i-th holding's key, ``ARGV[2i]`` and ``ARGV[2i+1]``
    its token and lease (ms), as EXTEND takes them; its queue is its key
    followed by ``ARGV[1]``, the kind's queue suffix (one kind per script).
    Returns one reply per holding, 1 or 0 as EXTEND's, or -1 if its extend
    failed with an error that says nothing of whose the key is (a slot
    migrating): that one is tried again. A holding whose key is of another
    type (``WRONGTYPE``: someone else's) answers 0. Either way the others go
    on.
    """
    return Script(
        extend
        + """
local done = {}
for i = 1, #KEYS do
    local ok, extended = pcall(extend, KEYS[i], ARGV[2 * i], ARGV[2 * i + 1], KEYS[i] .. ARGV[1])
    if ok then
        done[i] = extended
    else
        local text = extended
        if type(text) == 'table' then
            text = text.err or ''
        end
        if string.find(tostring(text), 'WRONGTYPE', 1, true) then
            done[i] = 0
        else
            done[i] = -1
        end
    end
end
return done
"""
    )


EXTEND = _one(_EXTEND_LOCK)
EXTEND_MANY = _many(_EXTEND_LOCK)

# A sorted set or hash of holders (a semaphore's, a read-write lock's) lives as long as
# its longest lease: a lease set to end at `now + ms` keeps the key at least that long.
# (Its expiry is only its clean-up: each holder's own end is in its member.)
_OUTLIVE = """
local function outlive(key, ms)
    local left = redis.call('PTTL', key)
    if left >= 0 and left < tonumber(ms) then
        redis.call('PEXPIRE', key, ms)
    end
end
"""


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
# as in ACQUIRE). Run again after it swapped the tokens (its reply was lost), it
# finds the next holder's token and answers {1, fence} again. The queue is not touched
# without ARGV[6]: a local run looks at it after LOCAL_RUN (0.1 s) at the latest,
# and whatever began the run (a grant, a queued attempt) left it at least
# QUEUE_SLACK_MS to live.
HANDOVER = Script(
    _GRANT
    + """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[2] then
    -- Run already (its reply was lost): the next holder has it.
    local fence = 0
    if ARGV[7] == '1' then
        fence = tonumber(redis.call('GET', KEYS[3]))
    end
    return {1, fence}
end
if holder ~= ARGV[1] then
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


# The server's clock in milliseconds (the leases of a semaphore's permits and of a
# read-write lock's holders are kept as their ends by this clock).
_NOW = """
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""


# --- the semaphore's scripts --------------------------------------------------------
#
# A semaphore's key (KEYS[1]) is a sorted set of its holders: each permit's token, scored
# with when its lease ends, in the server's milliseconds (TIME). A permit whose lease has
# ended is dropped when met; the set expires with its last lease, and vanishes when its
# last member is removed. The queue (KEYS[2]) and the entries are the lock's; a grant
# adds the heir's token to the set. KEYS[3] (the fencing counter) is never touched: a
# semaphore has no fence, but the scripts take the lock's keys.
_HOLDERS = (
    _NOW
    + _TELL
    + """

-- The set lives as long as its longest lease (call it after adding or removing one).
local function keep()
    local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    if last[2] then
        redis.call('PEXPIREAT', KEYS[1], last[2])
    end
end

-- Give `heir` a permit: its entry's first lease, from now.
local function give(heir, now, ms)
    redis.call('ZADD', KEYS[1], now + tonumber(ms), heir)
    keep()
    redis.call('PEXPIRE', KEYS[2], tonumber(ms) + """
    + str(QUEUE_SLACK_MS)
    + """)
end

-- The grant rule: while a permit is free, grant it to the first live waiter.
-- Returns how many it granted.
local function grant_free(limit, now, channel, sharded)
    local granted = 0
    while redis.call('ZCARD', KEYS[1]) < limit do
        local heir = redis.call('LPOP', KEYS[2])
        if not heir then
            break
        end
        local ms, fenced, written, tag = take_entry(heir)
        if ms then
            give(heir, now, ms)
            tell(channel, sharded, heir, ms, 0, written, tag)
            granted = granted + 1
        end
    end
    return granted
end
"""
)

# SEMAPHORE_ACQUIRE: ACQUIRE's keys and arguments (ARGV[6], fencing, is '0'), and
#   ARGV[9]  the limit
# A permit is free while fewer than `limit` unexpired tokens hold one. The caller takes
# one if it is free and no live waiter is queued before it (those before it are granted
# the free permits first). Returns {1, 0} when the caller holds a permit now (it was
# granted one, or an earlier run of this attempt took one: its lease starts again),
# else {0, ms}: when the first permit's lease ends; the caller is then queued as by
# ACQUIRE.
SEMAPHORE_ACQUIRE = Script(
    _HOLDERS
    + _QUEUE_UP
    + """
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local mine = KEYS[2] .. ':' .. ARGV[1]
local limit = tonumber(ARGV[9])
if ARGV[5] ~= '0' and redis.call('ZSCORE', KEYS[1], ARGV[1]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
    keep()
    redis.call('DEL', mine)
    return {1, 0}
end
while redis.call('ZCARD', KEYS[1]) < limit do
    local head = redis.call('LINDEX', KEYS[2], 0)
    if not head or head == ARGV[1] then
        redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
        keep()
        if head then
            redis.call('LPOP', KEYS[2])
            redis.call('DEL', mine)
            redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + """
    + str(QUEUE_SLACK_MS)
    + """)
        end
        return {1, 0}
    end
    redis.call('LPOP', KEYS[2])
    local ms, fenced, written, tag = take_entry(head)
    if ms then
        give(head, now, ms)
        tell(ARGV[7], ARGV[8], head, ms, 0, written, tag)
    end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
-- (A queue it makes lives as long as the longest lease, the set's own.)
queue_up(mine, nil)
return {0, tonumber(first[2]) - now}
"""
)

# SEMAPHORE_RELEASE: RELEASE's keys and arguments, and
#   ARGV[4]  the limit
# Gives the permit of the token back if it still held one (its lease not over), and
# grants the free permits to the first live waiters. Returns 2 if it granted one, 1 if
# it released with nobody queued (an empty message then wakes the pollers), 0 if the
# token held no permit (nothing of anyone else's is touched).
SEMAPHORE_RELEASE = Script(
    _HOLDERS
    + """
local now = now_ms()
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
local ours = ends and tonumber(ends) > now
if ours then
    redis.call('ZREM', KEYS[1], ARGV[1])
end
-- (A permit whose lease ended is free too: the purge gives it on.)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local granted = grant_free(tonumber(ARGV[4]), now, ARGV[2], ARGV[3])
if ours and granted == 0 then
    keep()  -- the longest lease may have been ours
end
if granted > 0 then
    if ours then
        return 2
    end
elseif ours then
    announce(ARGV[2], ARGV[3], '')
end
if ours then
    return 1
end
return 0
"""
)

# SEMAPHORE_LEAVE: LEAVE's keys and arguments, and
#   ARGV[4]  the limit
# Takes the waiter out of the queue; gives back a permit its token held (a grant, or an
# attempt, that raced the giving up), granting it on. Returns 1 if it held one, else 0.
SEMAPHORE_LEAVE = Script(
    _HOLDERS
    + """
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('DEL', KEYS[2] .. ':' .. ARGV[1])
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
    local now = now_ms()
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    if grant_free(tonumber(ARGV[4]), now, ARGV[2], ARGV[3]) == 0 then
        keep()  -- the longest lease may have been ours
        announce(ARGV[2], ARGV[3], '')
    end
    return 1
end
return 0
"""
)

# SEMAPHORE_EXTEND: EXTEND's keys and arguments (one key). Resets the permit's lease if
# the token still holds one (its lease not over); keeps the queue that long plus its
# slack. Returns 1 if it did, else 0. O(log N) in the permits held.
_EXTEND_PERMIT = (
    _NOW
    + _OUTLIVE
    + """
local function extend(key, token, ms, queue)
    local now = now_ms()
    local ends = redis.call('ZSCORE', key, token)
    if not ends or tonumber(ends) <= now then
        return 0
    end
    redis.call('ZADD', key, now + tonumber(ms), token)
    if now + tonumber(ms) >= tonumber(ends) then
        outlive(key, ms)
    else
        -- A shorter lease than before: the set lives for the longest left (O(log N)).
        local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        redis.call('PEXPIREAT', key, last[2])
    end
    redis.pcall('PEXPIRE', queue, tonumber(ms) + """
    + str(QUEUE_SLACK_MS)
    + """)
    return 1
end
"""
)
SEMAPHORE_EXTEND = _one(_EXTEND_PERMIT)
SEMAPHORE_EXTEND_MANY = _many(_EXTEND_PERMIT)

# SEMAPHORE_HANDOVER (a semaphore of one permit: a release straight to the next
# waiting task of the same process; only a semaphore of one permit hands over)
#   KEYS     as SEMAPHORE_ACQUIRE
#   ARGV[1]  the releasing holder's token
#   ARGV[2]  the next holder's token
#   ARGV[3]  the next holder's lease in milliseconds
#   ARGV[4]  the channel
#   ARGV[5]  '1' on a cluster (sharded pub/sub)
#   ARGV[6]  the limit
#   ARGV[7]  '1' if the permit should go to the queue's first live waiter, if there is one
# Returns {0, 0} if the token held no permit (nothing is touched); {2, 0} if the permit
# went to the queue's first live waiter instead (ARGV[7]); otherwise {1, 0}: the next
# holder's token holds the permit now, with its lease (also when run again after its
# reply was lost).
SEMAPHORE_HANDOVER = Script(
    _HOLDERS
    + """
local now = now_ms()
local heirs = redis.call('ZSCORE', KEYS[1], ARGV[2])
if heirs and tonumber(heirs) > now then
    return {1, 0}  -- run already (its reply was lost): the next holder has the permit
end
local ends = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not ends or tonumber(ends) <= now then
    return {0, 0}
end
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[7] == '1' then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    if grant_free(tonumber(ARGV[6]), now, ARGV[4], ARGV[5]) > 0 then
        return {2, 0}
    end
end
local heir_ends = now + tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], heir_ends, ARGV[2])
-- With one permit the heir is the only holder: its lease is the set's.
redis.call('PEXPIREAT', KEYS[1], string.format('%d', heir_ends))
return {1, 0}
"""
)

# SEMAPHORE_STATE (read only)
#   KEYS[1]  the holders
#   ARGV[1]  the limit
#   ARGV[2]  a token, or ''
# Returns {permits held (unexpired), ms until the first of them ends (-2: a permit is
# free, so there is nothing to wait for), 1 if the token holds a permit else 0}.
SEMAPHORE_STATE = Script(
    _NOW
    + """
local now = now_ms()
local held = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local left = -2
if held >= tonumber(ARGV[1]) then
    local first = redis.call(
        'ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1
    )
    left = tonumber(first[2]) - now
end
local mine = 0
if ARGV[2] ~= '' then
    local ends = redis.call('ZSCORE', KEYS[1], ARGV[2])
    if ends and tonumber(ends) > now then
        mine = 1
    end
end
return {held, left, mine}
"""
)


# --- the read-write lock's scripts --------------------------------------------------
#
# A read-write lock's key (KEYS[1]) is a hash of its holders: each holder's token ->
# its kind and when its lease ends, in the server's milliseconds ('r<ms>' for a reader,
# 'w<ms>' for the writer); the field '=w' names the writer's token while one holds.
# Beside it, its *index* (KEYS[3], ``<lock>:ends``) is a sorted set of the same tokens
# scored with their ends: how many hold, the first and the last end are read there in
# O(log N), never by reading every holder. A holding whose lease has ended is dropped
# when met (at most 16 per script, oldest first); both keys expire with the last
# lease, and vanish with the last holder. Readers share; the writer excludes everyone.
# Readers and writers wait in one queue (KEYS[2]) in arrival order, so a reader that
# comes after a waiting writer waits behind it. A grant goes to the first live waiter if
# its kind is admitted now, and on to the next while they are readers and admitted.
RW_INDEX_SUFFIX = ":ends"
_RW_PURGE_MOST = 16

_RW = (
    _NOW
    + _TELL
    + """

-- Drop a holder: its field, its end in the index, and the writer's mark if it was it.
local function unhold(token)
    redis.call('HDEL', KEYS[1], token)
    redis.call('ZREM', KEYS[3], token)
    if redis.call('HGET', KEYS[1], '=w') == token then
        redis.call('HDEL', KEYS[1], '=w')
    end
end

-- The holders now: {readers, writer's token or false, the first lease's end, the last
-- lease's end} (ends 0 without holders). Drops a few holders whose lease ended.
local function scan(now)
    if redis.call('EXISTS', KEYS[1]) == 0 then
        redis.call('DEL', KEYS[3])  -- (the hash deleted by hand: nobody holds)
    end
    local over = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, """
    + str(_RW_PURGE_MOST)
    + """)
    for _, token in ipairs(over) do
        unhold(token)
    end
    local live = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
    local writer = redis.call('HGET', KEYS[1], '=w')
    if writer then
        local value = redis.call('HGET', KEYS[1], writer)
        if not value or tonumber(string.sub(value, 2)) <= now then
            writer = false
        end
    end
    local readers = live
    if writer then
        readers = live - 1
    end
    local first, last = 0, 0
    if live > 0 then
        local lowest = redis.call(
            'ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1
        )
        first = tonumber(lowest[2])
        last = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2])
    end
    return {readers, writer, first, last}
end

local function admits(state, kind)
    if kind == 'w' then
        return state[1] == 0 and not state[2]
    end
    return not state[2]
end

-- Both keys live as long as the longest lease.
local function keep(last)
    local at = string.format('%d', last)
    redis.call('PEXPIREAT', KEYS[1], at)
    redis.call('PEXPIREAT', KEYS[3], at)
end

-- Add a holder of `kind` with a lease of `ms` from now.
local function hold(state, token, kind, now, ms)
    local ends = now + tonumber(ms)
    redis.call('HSET', KEYS[1], token, kind .. string.format('%d', ends))
    redis.call('ZADD', KEYS[3], ends, token)
    if kind == 'w' then
        redis.call('HSET', KEYS[1], '=w', token)
        state[2] = token
    else
        state[1] = state[1] + 1
    end
    if state[3] == 0 or ends < state[3] then
        state[3] = ends
    end
    if ends > state[4] then
        state[4] = ends
    end
    keep(state[4])
end

-- The grant rule: grant to the first live waiters while their kind is admitted (a
-- writer ends the run). `me` (or false) is the caller, which is not granted here.
-- Returns how many it granted, and whether someone is left waiting at the head (`me`,
-- or a waiter not admitted yet).
local function grant_ready(state, now, channel, sharded, me)
    local granted = 0
    while true do
        local head = redis.call('LINDEX', KEYS[2], 0)
        if not head then
            return granted, false
        end
        if head == me then
            return granted, true
        end
        if granted > 0 and not admits(state, 'r') then
            return granted, true  -- a writer was granted: the rest wait
        end
        local entry = KEYS[2] .. ':' .. head
        local ms, kind, written, tag = read_entry(entry, false)
        if not ms then
            redis.call('LPOP', KEYS[2])  -- a dead (or unreadable) waiter's
        elseif admits(state, kind) then
            redis.call('LPOP', KEYS[2])
            redis.call('DEL', entry)
            hold(state, head, kind, now, ms)
            redis.call('PEXPIRE', KEYS[2], tonumber(ms) + """
    + str(QUEUE_SLACK_MS)
    + """)
            tell(channel, sharded, head, ms, 0, written, tag)
            granted = granted + 1
        else
            return granted, true
        end
    end
end
"""
)

# RW_ACQUIRE: ACQUIRE's keys and arguments (ARGV[6], fencing, is '0'; KEYS[3] is the
# index, not the fencing counter), and
#   ARGV[9]  the caller's kind: 'r' (a reader) or 'w' (a writer)
# The caller takes the lock if its kind is admitted now and no live waiter is queued
# before it (those before it are granted first, while admitted). Returns {1, 0} when it
# holds now (it was granted, or an earlier run of this attempt took it: its lease
# starts again), else {0, ms}: when the first holder's lease ends; the caller is then
# queued as by ACQUIRE.
RW_ACQUIRE = Script(
    _RW
    + _QUEUE_UP
    + """
local now = now_ms()
local mine = KEYS[2] .. ':' .. ARGV[1]
local kind = ARGV[9]
if ARGV[5] ~= '0' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    unhold(ARGV[1])
    local state = scan(now)
    hold(state, ARGV[1], kind, now, ARGV[2])
    redis.call('DEL', mine)
    return {1, 0}
end
local state = scan(now)
grant_ready(state, now, ARGV[7], ARGV[8], ARGV[1])
local head = redis.call('LINDEX', KEYS[2], 0)
local next_in_line = head == ARGV[1]
if (not head or next_in_line) and admits(state, kind) then
    hold(state, ARGV[1], kind, now, ARGV[2])
    if next_in_line then
        redis.call('LPOP', KEYS[2])
        redis.call('DEL', mine)
        redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + """
    + str(QUEUE_SLACK_MS)
    + """)
        -- The readers queued right behind a reader come in with it.
        grant_ready(state, now, ARGV[7], ARGV[8], false)
    end
    return {1, 0}
end
queue_up(mine, nil)
local left = -1
if state[3] > 0 then
    left = state[3] - now
end
return {0, left}
"""
)

# RW_RELEASE: RELEASE's keys and arguments (KEYS[3]: the index). Removes the caller's
# holding if it still held (its lease not over), and grants to the waiters now admitted.
# Returns 2 if it granted, 1 if it released with nobody granted (an empty message then
# wakes the pollers), 0 if the token held nothing (nothing of anyone else's is touched;
# a field of its own whose lease was over is dropped).
RW_RELEASE = Script(
    _RW
    + """
local now = now_ms()
local value = redis.call('HGET', KEYS[1], ARGV[1])
local ours = value and tonumber(string.sub(value, 2)) > now
if value then
    unhold(ARGV[1])
end
local state = scan(now)
local granted, waiting = grant_ready(state, now, ARGV[2], ARGV[3], false)
if ours and granted == 0 and state[4] > 0 then
    keep(state[4])  -- the longest lease may have been ours
end
if not ours then
    return 0
end
if granted > 0 then
    return 2
end
if not waiting then
    -- Nobody queued: wake the waiters that poll. (Queued ones not admitted yet are
    -- granted when their turn comes: waking them would only make them ask.)
    announce(ARGV[2], ARGV[3], '')
end
return 1
"""
)

# RW_LEAVE: LEAVE's keys and arguments (KEYS[3]: the index). Takes the waiter out of the
# queue; gives back a holding its token had (a grant, or an attempt, that raced the
# giving up), granting on. Returns 1 if it held, else 0.
RW_LEAVE = Script(
    _RW
    + """
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('DEL', KEYS[2] .. ':' .. ARGV[1])
local held = redis.call('HEXISTS', KEYS[1], ARGV[1])
if held == 1 then
    unhold(ARGV[1])
end
local now = now_ms()
local state = scan(now)
-- (A waiter that left may have been the one the others waited behind.)
local granted, waiting = grant_ready(state, now, ARGV[2], ARGV[3], false)
if held == 1 and granted == 0 and state[4] > 0 then
    keep(state[4])
end
if granted == 0 and not waiting and held == 1 then
    announce(ARGV[2], ARGV[3], '')
end
return held
"""
)

# RW_EXTEND: EXTEND's keys and arguments (one key: the hash). Resets the holding's lease
# if the token still holds (its lease not over), in the hash and in the index
# (``<key>:ends``, not declared: see EXTEND); keeps the queue that long plus its slack.
# Returns 1 if it did, else 0. If the index cannot be written (its slot migrating), the
# extend fails and changes nothing: the index must never say a lease ends before the
# holder thinks it does. O(log N) in the holders.
_EXTEND_RW = (
    _NOW
    + """
local function extend(key, token, ms, queue)
    local now = now_ms()
    local value = redis.call('HGET', key, token)
    local index = key .. '"""
    + RW_INDEX_SUFFIX
    + """'
    if not value or tonumber(string.sub(value, 2)) <= now then
        redis.pcall('ZREM', index, token)  -- (its own end, if the hash lost it)
        return 0
    end
    local ends = now + tonumber(ms)
    redis.call('ZADD', index, ends, token)
    redis.call('HSET', key, token, string.sub(value, 1, 1) .. string.format('%d', ends))
    local last = tonumber(redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')[2])
    local at = string.format('%d', last)
    redis.call('PEXPIREAT', key, at)
    redis.call('PEXPIREAT', index, at)
    redis.pcall('PEXPIRE', queue, tonumber(ms) + """
    + str(QUEUE_SLACK_MS)
    + """)
    return 1
end
"""
)
RW_EXTEND = _one(_EXTEND_RW)
RW_EXTEND_MANY = _many(_EXTEND_RW)

# RW_STATE (read only)
#   KEYS[1]  the holders
#   KEYS[2]  the index
#   ARGV[1]  a token, or ''
#   ARGV[2]  the asking waiter's kind ('r', 'w'), or ''
# Returns {readers holding, 1 if a writer holds else 0, ms until the first holder's
# lease ends (-2: no holder, or the asking waiter's kind is admitted now: it should
# attempt, which clears dead waiters queued before it), 1 if the token holds else 0}.
RW_STATE = Script(
    _NOW
    + """
local now = now_ms()
local live = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
    live = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
end
local writer = 0
local marked = redis.call('HGET', KEYS[1], '=w')
if marked then
    local value = redis.call('HGET', KEYS[1], marked)
    if value and tonumber(string.sub(value, 2)) > now then
        writer = 1
    end
end
local readers = live - writer
local first = 0
if live > 0 then
    local lowest = redis.call(
        'ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1
    )
    first = tonumber(lowest[2])
end
local mine = 0
if ARGV[1] ~= '' then
    local value = redis.call('HGET', KEYS[1], ARGV[1])
    if value and tonumber(string.sub(value, 2)) > now then
        mine = 1
    end
end
local left = -2
local admitted = (ARGV[2] == 'r' and writer == 0) or (ARGV[2] == 'w' and first == 0)
if first > 0 and not admitted then
    left = first - now
end
return {readers, writer, left, mine}
"""
)
