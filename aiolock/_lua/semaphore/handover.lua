-- SEMAPHORE_HANDOVER: a semaphore of one permit hands its permit straight to the next
-- waiting task of the same process (only a semaphore of one permit hands over).
--
-- KEYS[1] lock: the semaphore's key
-- KEYS[2] queue: the queue
-- ARGV[1] token: the releasing holder's token
-- ARGV[2] heir: the next holder's token
-- ARGV[3] heir_ms: the next holder's lease in milliseconds
-- ARGV[4] channel: the semaphore's channel
-- ARGV[5] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[6] limit: how many permits there are
-- ARGV[7] may_yield: '1' if the permit should go to the queue's first live waiter, if
--     there is one
-- return {0, 0} if the token held no permit (nothing is touched); {2, 0} if the permit
--     went to the queue's first live waiter instead (may_yield); otherwise {1, 0}: the
--     next holder's token holds the permit now, with its lease (also when run again
--     after its reply was lost).
--@include clock
--@include grant_permits

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
