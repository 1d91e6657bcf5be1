-- RW_ACQUIRE: one attempt of a reader or the writer; a waiter's attempt also puts it
-- in the queue.
--
-- KEYS[1] lock: the read-write lock's key (a hash of its holders: see lib/holders.lua)
-- KEYS[2] queue: the queue
-- KEYS[3] index: the index of the holders' ends
-- ARGV[1] token: the caller's token
-- ARGV[2] ms: the lease in milliseconds
-- ARGV[3] entry: the entry to queue with, as ACQUIRE's (its letter the caller's kind);
--     '' to not queue
-- ARGV[4] entry_ms: the entry's life in milliseconds
-- ARGV[5] looks: what to look at first, as ACQUIRE's
-- ARGV[6] channel: the lock's channel
-- ARGV[7] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[8] kind: the caller's kind: 'r' (a reader) or 'w' (a writer)
-- return {1, 0} when the caller holds now (it was granted, or an earlier run of this
--     attempt took it: its lease starts again), else {0, ms}: when the first holder's
--     lease ends (-1: no holder); the caller is then queued as by ACQUIRE. The caller
--     takes the lock if its kind is admitted now and no live waiter is queued before it
--     (those before it are granted first, while admitted).
--@include holders
--@include queue_up

local now = now_ms()
local mine = KEYS[2] .. ':' .. ARGV[1]
local kind = ARGV[8]
if ARGV[5] ~= '0' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
    unhold(ARGV[1])
    local state = scan(now)
    hold(state, ARGV[1], kind, now, ARGV[2])
    redis.call('DEL', mine)
    return {1, 0}
end
local state = scan(now)
grant_ready(state, now, ARGV[6], ARGV[7], ARGV[1])
local head = redis.call('LINDEX', KEYS[2], 0)
local next_in_line = head == ARGV[1]
if (not head or next_in_line) and admits(state, kind) then
    hold(state, ARGV[1], kind, now, ARGV[2])
    if next_in_line then
        redis.call('LPOP', KEYS[2])
        redis.call('DEL', mine)
        redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + QUEUE_SLACK_MS)
        -- The readers queued right behind a reader come in with it.
        grant_ready(state, now, ARGV[6], ARGV[7], false)
    end
    return {1, 0}
end
queue_up(mine, ARGV[1], ARGV[3], ARGV[4], ARGV[5], nil)
local left = -1
if state[3] > 0 then
    left = state[3] - now
end
return {0, left}
