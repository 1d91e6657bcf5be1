-- ACQUIRE: one attempt at the lock; a waiter's attempt also puts it in the queue.
--
-- KEYS[1] lock: the lock key
-- KEYS[2] queue: the queue
-- KEYS[3] fence: the fencing counter (touched only with fencing, or for a fencing heir)
-- ARGV[1] token: the caller's token
-- ARGV[2] ms: the lease in milliseconds
-- ARGV[3] entry: the entry to queue with if the lock is not taken (see lib/entry.lua:
--     the lease a grant gives, 'f' if it wants a fence, the number of this attempt, the
--     tag of the channel its grant goes to, its keeper); '' to not queue
-- ARGV[4] entry_ms: the entry's life in milliseconds
-- ARGV[5] looks: what to look at first: '1' the caller may be queued already (or even
--     granted the lock): the key and the queue; '2' the key (its kind, and whether it
--     holds the token already); '0' nothing (the key is known to be a lock's and
--     someone else's)
-- ARGV[6] fencing: '1' with fencing
-- ARGV[7] channel: the lock's channel
-- ARGV[8] sharded: '1' on a cluster (sharded pub/sub)
-- return {1, fence} when the caller holds the lock now (fence 0 without fencing): the
--     key holds its token already (a grant, or an earlier run of this very attempt
--     whose reply was lost: its lease starts again), or the lock was free and nobody
--     alive was queued before it. Run twice, it answers the same. Otherwise {0, pttl}:
--     the holder's remaining lease in ms (-1: no expiry); a free lock with a live
--     waiter queued first is granted to that waiter (pttl is then its lease). Unless
--     the entry is '', the caller is then in the queue, once; its entry lives entry_ms.
--     A queue it makes (or may have lost) is kept for the holder's lease plus the
--     slack; a queue that was there already is kept by whatever gave the holder its
--     lease (a grant, a hand-over, a renewal each extend it).
--@include grant
--@include queue_up

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
            redis.call('PEXPIRE', KEYS[2], ARGV[2] + QUEUE_SLACK_MS)
        end
        return taken()
    end
    -- (Nobody granted: only unreadable entries were queued. Then attempt again.)
    pttl = grant_next(ARGV[7], ARGV[8]) or -2
end
queue_up(mine, ARGV[1], ARGV[3], ARGV[4], ARGV[5], pttl)
return {0, pttl}
