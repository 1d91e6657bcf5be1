-- STATUS_HOLDERS: every holder of a semaphore's or a read-write lock's key, and the
-- server's clock (read only; `aiolock status`).
--
-- KEYS[1] lock: the semaphore's or the read-write lock's key
-- return {the server's clock in ms (a string), the holders' ends}: each end as the
--     holder's kind and the server's ms its lease ends at ('p<ms>' a permit, 'r<ms>' a
--     reader, 'w<ms>' the writer), in no particular order. See decode_holders in
--     aiolock._scripts.
--@include clock

local now = now_ms()
local ends = {}
if redis.call('TYPE', KEYS[1])['ok'] == 'zset' then
    local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
    for i = 2, #members, 2 do
        ends[#ends + 1] = 'p' .. members[i]
    end
else
    local fields = redis.call('HGETALL', KEYS[1])
    for i = 2, #fields, 2 do
        if string.sub(fields[i - 1], 1, 1) ~= '=' then  -- ('=w' names the writer)
            ends[#ends + 1] = fields[i]
        end
    end
end
return {tostring(now), ends}
