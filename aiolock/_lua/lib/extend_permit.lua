--@include clock
--@include outlive
-- extend(key, token, ms, queue): a semaphore permit's extend. Resets the permit's lease
-- if the token still holds one (its lease not over); keeps the queue that long plus
-- its slack. Returns 1 if it did, else 0. O(log N) in the permits held.
local function extend(key, token, ms, queue)
    local now = now_ms()
    local ends = redis.call('ZSCORE', key, token)
    if not ends or tonumber(ends) <= now then
        return 0
    end
    redis.call('ZADD', key, now + tonumber(ms), token)
    if now + tonumber(ms) >= tonumber(ends) then
        outlive(key, ms)
    else
        -- A shorter lease than before: the set lives for the longest left (O(log N)).
        local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
        redis.call('PEXPIREAT', key, last[2])
    end
    redis.pcall('PEXPIRE', queue, tonumber(ms) + QUEUE_SLACK_MS)
    return 1
end
