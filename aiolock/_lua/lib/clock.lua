-- now_ms(): the server's clock in milliseconds. A semaphore's permits and a read-write
-- lock's holders keep their leases as their ends by this clock.
local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
