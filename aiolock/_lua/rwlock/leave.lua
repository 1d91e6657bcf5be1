-- RW_LEAVE: a waiter that gives up; also the undo of an attempt.
--
-- KEYS[1] lock: the read-write lock's key
-- KEYS[2] queue: the queue
-- KEYS[3] index: the index of the holders' ends
-- ARGV[1] token: the waiter's token
-- ARGV[2] channel: the lock's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- return 1 if the token held, else 0. Takes the waiter out of the queue; gives back a
--     holding its token had (a grant, or an attempt, that raced the giving up),
--     granting on.
--@include holders

redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('DEL', KEYS[2] .. ':' .. ARGV[1])
local held = redis.call('HEXISTS', KEYS[1], ARGV[1])
if held == 1 then
    unhold(ARGV[1])
end
local now = now_ms()
local state = scan(now)
-- (A waiter that left may have been the one the others waited behind.)
local granted, waiting = grant_ready(state, now, ARGV[2], ARGV[3], false)
if held == 1 and granted == 0 and state[4] > 0 then
    keep(state[4])
end
if granted == 0 and not waiting and held == 1 then
    announce(ARGV[2], ARGV[3], '')
end
return held
