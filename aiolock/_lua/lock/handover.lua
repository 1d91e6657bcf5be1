-- HANDOVER: a release straight to the next waiter of the same process.
--
-- KEYS[1] lock: the lock key
-- KEYS[2] queue: the queue
-- KEYS[3] fence: the fencing counter
-- ARGV[1] token: the releasing holder's token
-- ARGV[2] heir: the next holder's token
-- ARGV[3] may_yield: '1' if the lock should go to the queue's first live waiter, if
--     there is one
-- ARGV[4] channel: the lock's channel
-- ARGV[5] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[6] heir_ms: the next holder's lease in milliseconds
-- ARGV[7] heir_fencing: '1' if the next holder fences
-- return {0, 0} if the key was not the releaser's (nothing is touched); {2, ms} if it
--     went to the queue's first live waiter instead (may_yield; ms: its lease);
--     otherwise {1, fence}: the key now holds the next holder's token and lease (fence
--     as in ACQUIRE). Run again after it swapped the tokens (its reply was lost), it
--     finds the next holder's token and answers {1, fence} again. The queue is not
--     touched without may_yield: a local run looks at it after LOCAL_RUN (0.1 s) at
--     the latest, and whatever began the run (a grant, a queued attempt) left it at
--     least its slack to live.
--@include grant

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
if ARGV[3] == '1' then
    local granted = grant_next(ARGV[4], ARGV[5])
    if granted then
        return {2, granted}
    end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[6])
if ARGV[7] == '1' then
    return {1, next_fence(KEYS[3])}
end
return {1, 0}
