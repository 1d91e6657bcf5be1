-- next_fence(key): the next fence of a lock, `key` its fencing counter: one more than
-- the last, and never below the server's clock in microseconds. The floor keeps fences
-- increasing across a restart that lost the counter (no persistence, or a failover to
-- a replica without it): otherwise the first holder after the restart would get fence
-- 1 while a stale holder from before still writes with a higher one, or get the very
-- fence a stale holder uses. It assumes the server's clock does not go back across a
-- restart by more than the fences advanced, and fewer than a million fences per second.
local function next_fence(key)
    local fence = redis.call('INCR', key)
    local now = redis.call('TIME')
    local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
    if fence < floor then
        redis.call('SET', key, string.format('%d', floor))
        return floor
    end
    return fence
end
