-- SEMAPHORE_LEAVE: a waiter that gives up; also the undo of an attempt.
--
-- KEYS[1] lock: the semaphore's key
-- KEYS[2] queue: the queue
-- ARGV[1] token: the waiter's token
-- ARGV[2] channel: the semaphore's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[4] limit: how many permits there are
-- return 1 if the token held a permit, else 0. Takes the waiter out of the queue; gives
--     back a permit its token held (a grant, or an attempt, that raced the giving up),
--     granting it on.
--@include clock
--@include grant_permits

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
