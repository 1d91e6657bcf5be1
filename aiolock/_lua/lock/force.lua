-- FORCE: an operator frees a lock on purpose (aiolock release --force).
--
-- KEYS[1] lock: the lock key
-- KEYS[2] queue: the queue
-- KEYS[3] fence: the fencing counter (for a fencing heir)
-- ARGV[1] forcer: who forces it, in words
-- ARGV[2] channel: the lock's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- return {the token it took the lock from, or false if the lock was not held; the
--     lease given to the next waiter (ms), or false with nobody granted}. The holder's
--     token gets a mark, '<lock>:forced:<token>' = forcer, that lives the holder's
--     remaining lease plus FORCED_MARK_MS: its next renewal or release finds the key
--     gone and reads there why. Then the grant rule: the first live waiter gets the lock.
--@include grant

if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then
    return {false, false}
end
local token = redis.call('GET', KEYS[1])
local left = redis.call('PTTL', KEYS[1])
redis.call('SET', KEYS[1] .. ':forced:' .. token, ARGV[1], 'PX', math.max(left, 0) + FORCED_MARK_MS)
redis.call('DEL', KEYS[1])
local granted = grant_next(ARGV[2], ARGV[3])
if not granted then
    announce(ARGV[2], ARGV[3], '')
end
return {token, granted}
