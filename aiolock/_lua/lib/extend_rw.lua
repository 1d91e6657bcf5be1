--@include clock
-- extend(key, token, ms, queue): a read-write lock holding's extend. Resets the
-- holding's lease if the token still holds (its lease not over), in the hash and in
-- its index (`key .. RW_INDEX_SUFFIX`, not a declared key: the extend scripts declare
-- the holding's key alone); keeps the queue that long plus its slack. Returns 1 if it
-- did, else 0. If the index cannot be written (its slot migrating), the extend fails
-- and changes nothing: the index must never say a lease ends before the holder thinks
-- it does. O(log N) in the holders.
local function extend(key, token, ms, queue)
    local now = now_ms()
    local value = redis.call('HGET', key, token)
    local index = key .. RW_INDEX_SUFFIX
    if not value or tonumber(string.sub(value, 2)) <= now then
        redis.pcall('ZREM', index, token)  -- (its own end, if the hash lost it)
        return 0
    end
    local ends = now + tonumber(ms)
    redis.call('ZADD', index, ends, token)
    redis.call('HSET', key, token, string.sub(value, 1, 1) .. string.format('%d', ends))
    local last = tonumber(redis.call('ZRANGE', index, -1, -1, 'WITHSCORES')[2])
    local at = string.format('%d', last)
    redis.call('PEXPIREAT', key, at)
    redis.call('PEXPIREAT', index, at)
    redis.pcall('PEXPIRE', queue, tonumber(ms) + QUEUE_SLACK_MS)
    return 1
end
