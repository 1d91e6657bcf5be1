-- SEMAPHORE_STATE: how a semaphore is held (read only).
--
-- KEYS[1] lock: the semaphore's key
-- ARGV[1] limit: how many permits there are
-- ARGV[2] token: a token, or ''
-- return {permits held (unexpired), ms until the first of them ends (-2: a permit is
--     free, so there is nothing to wait for), 1 if the token holds a permit else 0}.
--@include clock

local now = now_ms()
local held = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local left = -2
if held >= tonumber(ARGV[1]) then
    local first = redis.call(
        'ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1
    )
    left = tonumber(first[2]) - now
end
local mine = 0
if ARGV[2] ~= '' then
    local ends = redis.call('ZSCORE', KEYS[1], ARGV[2])
    if ends and tonumber(ends) > now then
        mine = 1
    end
end
return {held, left, mine}
