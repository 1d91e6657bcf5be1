-- SEMAPHORE_FORCE: an operator frees every permit of a semaphore on purpose.
--
-- KEYS[1] lock: the semaphore's key
-- KEYS[2] queue: the queue
-- ARGV[1] forcer: who forces it, in words
-- ARGV[2] channel: the semaphore's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- return {the tokens whose permits it took (their leases not over), how many waiters it
--     granted}. Each such token gets a mark, '<key>:forced:<token>' = forcer, for its
--     remaining lease plus FORCED_MARK_MS (see lock/force.lua). The freed permits go to
--     the first live waiters, at most as many as were freed: the limit is the holders',
--     and they had that many at least.
--@include clock
--@include grant_permits

if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
    return {{}, 0}
end
local now = now_ms()
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local tokens = {}
for i = 1, #members, 2 do
    local ms = tonumber(members[i + 1]) - now
    redis.call('SET', KEYS[1] .. ':forced:' .. members[i], ARGV[1], 'PX', ms + FORCED_MARK_MS)
    tokens[#tokens + 1] = members[i]
end
redis.call('DEL', KEYS[1])
local granted = grant_free(#tokens, now, ARGV[2], ARGV[3])
if granted == 0 then
    announce(ARGV[2], ARGV[3], '')
end
return {tokens, granted}
