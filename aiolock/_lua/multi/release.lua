-- MULTI_RELEASE: give back every lock of one hash slot that holds the caller's token.
--
-- ARGV[1] token: the holder's token
-- ARGV[2] sharded: '1' on a cluster (sharded pub/sub)
-- ARGV[3...] channels: each lock's release channel, in the order of KEYS
-- KEYS[1...] locks: the lock keys
-- return how many of the keys held the token: each of them is deleted and its release
--     announced (an empty message on its channel, which wakes its waiters: queued ones
--     attempt again, and the first live one in the queue gets it by the grant rule).
--     Keys that no longer held the token are not touched.
--@include announce

local freed = 0
for i = 1, #KEYS do
    if redis.call('GET', KEYS[i]) == ARGV[1] then
        redis.call('DEL', KEYS[i])
        announce(ARGV[2 + i], ARGV[2], '')
        freed = freed + 1
    end
end
return freed
