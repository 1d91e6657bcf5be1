-- RELEASE: the holder gives the lock back.
--
-- KEYS[1] lock: the lock key
-- KEYS[2] queue: the queue
-- KEYS[3] fence: the fencing counter (for a fencing heir)
-- ARGV[1] token: the holder's token
-- ARGV[2] channel: the lock's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- return 2 if the key held the token and the lock went to the first live waiter of the
--     queue; 1 if it held the token and nobody was queued (the key is deleted and the
--     release announced); 0 if the key was not ours (nothing is touched). The
--     announcements are best effort (see lib/announce.lua).
--@include grant

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
if grant_next(ARGV[2], ARGV[3]) then
    return 2
end
redis.call('DEL', KEYS[1])
announce(ARGV[2], ARGV[3], '')
return 1
