-- RW_FORCE: an operator frees a read-write lock on purpose: its readers or its writer.
--
-- KEYS[1] lock: the read-write lock's key
-- KEYS[2] queue: the queue
-- KEYS[3] index: the index of the holders' ends
-- ARGV[1] forcer: who forces it, in words
-- ARGV[2] channel: the lock's channel
-- ARGV[3] sharded: '1' on a cluster (sharded pub/sub)
-- return {the tokens whose holdings it took (their leases not over), how many waiters
--     it granted}. Each such token gets a mark, '<key>:forced:<token>' = forcer, for its
--     remaining lease plus FORCED_MARK_MS (see lock/force.lua). Then the grant rule:
--     the first live waiters, while their kind is admitted.
--@include holders

if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
    return {{}, 0}
end
local now = now_ms()
local fields = redis.call('HGETALL', KEYS[1])
local tokens = {}
for i = 1, #fields, 2 do
    local token = fields[i]
    local ends = tonumber(string.sub(fields[i + 1], 2))
    if string.sub(token, 1, 1) ~= '=' and ends and ends > now then
        redis.call('SET', KEYS[1] .. ':forced:' .. token, ARGV[1], 'PX', ends - now + FORCED_MARK_MS)
        tokens[#tokens + 1] = token
    end
end
redis.call('DEL', KEYS[1], KEYS[3])
local state = scan(now)
local granted, waiting = grant_ready(state, now, ARGV[2], ARGV[3], false)
if granted == 0 and not waiting then
    announce(ARGV[2], ARGV[3], '')
end
return {tokens, granted}
