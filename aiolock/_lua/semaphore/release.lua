-- SEMAPHORE_RELEASE: a holder gives its permit back.
--
-- KEYS[1] lock: the semaphore's key
-- KEYS[2] queue: the queue
-- ARGV[1] token: the holder's token
-- ARGV[2] channel: the semaphore's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[4] limit: how many permits there are
-- return 2 if the token held a permit (its lease not over) and a freed permit was
--     granted to a live waiter; 1 if it released with nobody granted (an empty message
--     then wakes the pollers); 0 if the token held no permit (nothing of anyone else's
--     is touched). The free permits go to the first live waiters.
--@include clock
--@include grant_permits

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
