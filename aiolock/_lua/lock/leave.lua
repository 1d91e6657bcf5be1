-- LEAVE: a waiter that gives up (cancelled, timed out, failed); also the undo of an
-- attempt.
--
-- KEYS[1] lock: the lock key
-- KEYS[2] queue: the queue
-- KEYS[3] fence: the fencing counter (for a fencing heir)
-- ARGV[1] token: the waiter's token
-- ARGV[2] channel: the lock's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- return 1 if the lock held the token, else 0. Takes the waiter out of the queue. If
--     the lock holds its token (a grant, or an attempt, that raced the giving up),
--     frees it by the grant rule, so the next waiter gets it.
--@include grant

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
