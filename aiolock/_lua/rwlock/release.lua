-- RW_RELEASE: a reader or the writer gives its holding back.
--
-- KEYS[1] lock: the read-write lock's key
-- KEYS[2] queue: the queue
-- KEYS[3] index: the index of the holders' ends
-- ARGV[1] token: the holder's token
-- ARGV[2] channel: the lock's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- return 2 if it granted, 1 if it released with nobody granted (an empty message then
--     wakes the pollers), 0 if the token held nothing (nothing of anyone else's is
--     touched; a field of its own whose lease was over is dropped). Removes the
--     caller's holding if it still held (its lease not over), and grants to the
--     waiters now admitted.
--@include holders

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
