-- RW_STATE: how a read-write lock is held (read only).
--
-- KEYS[1] lock: the read-write lock's key
-- KEYS[2] index: the index of the holders' ends
-- ARGV[1] token: a token, or ''
-- ARGV[2] asking: the asking waiter's kind ('r', 'w'), or ''
-- return {readers holding, 1 if a writer holds else 0, ms until the first holder's
--     lease ends (-2: no holder, or the asking waiter's kind is admitted now: it should
--     attempt, which clears dead waiters queued before it), 1 if the token holds else 0}.
--@include clock

local now = now_ms()
local live = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
    live = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
end
local writer = 0
local marked = redis.call('HGET', KEYS[1], '=w')
if marked then
    local value = redis.call('HGET', KEYS[1], marked)
    if value and tonumber(string.sub(value, 2)) > now then
        writer = 1
    end
end
local readers = live - writer
local first = 0
if live > 0 then
    local lowest = redis.call(
        'ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1
    )
    first = tonumber(lowest[2])
end
local mine = 0
if ARGV[1] ~= '' then
    local value = redis.call('HGET', KEYS[1], ARGV[1])
    if value and tonumber(string.sub(value, 2)) > now then
        mine = 1
    end
end
local left = -2
local admitted = (ARGV[2] == 'r' and writer == 0) or (ARGV[2] == 'w' and first == 0)
if first > 0 and not admitted then
    left = first - now
end
return {readers, writer, left, mine}
