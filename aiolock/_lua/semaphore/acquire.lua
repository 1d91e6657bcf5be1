-- SEMAPHORE_ACQUIRE: one attempt at a permit; a waiter's attempt also puts it in the
-- queue. A permit is free while fewer than `limit` unexpired tokens hold one.
--
-- KEYS[1] lock: the semaphore's key (a sorted set of its holders: see lib/permits.lua)
-- KEYS[2] queue: the queue
-- ARGV[1] token: the caller's token
-- ARGV[2] ms: the lease in milliseconds
-- ARGV[3] entry: the entry to queue with, as ACQUIRE's; '' to not queue
-- ARGV[4] entry_ms: the entry's life in milliseconds
-- ARGV[5] looks: what to look at first, as ACQUIRE's
-- ARGV[6] channel: the semaphore's channel
-- ARGV[7] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[8] limit: how many permits there are
-- return {1, 0} when the caller holds a permit now (it was granted one, or an earlier
--     run of this attempt took one: its lease starts again), else {0, ms}: when the
--     first permit's lease ends; the caller is then queued as by ACQUIRE. The caller
--     takes a permit if one is free and no live waiter is queued before it (those
--     before it are granted the free permits first).
--@include clock
--@include permits
--@include tell
--@include take
--@include queue_up

local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local mine = KEYS[2] .. ':' .. ARGV[1]
local limit = tonumber(ARGV[8])
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
            redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + QUEUE_SLACK_MS)
        end
        return {1, 0}
    end
    redis.call('LPOP', KEYS[2])
    local ms, _, written, tag = take_entry(head)
    if ms then
        give(head, now, ms)
        tell(ARGV[6], ARGV[7], head, ms, 0, written, tag)
    end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
-- (A queue it makes lives as long as the longest lease, the set's own.)
queue_up(mine, ARGV[1], ARGV[3], ARGV[4], ARGV[5], nil)
return {0, tonumber(first[2]) - now}
