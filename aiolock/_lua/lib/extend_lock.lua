-- extend(key, token, ms, queue): a lock's extend. Resets the lease only if the key
-- still holds the token, and keeps the queue (if any) for that long plus its slack.
-- Returns 1 if it did, 0 if the key is gone or belongs to someone else. The queue is
-- only ever extended here, never made; while a cluster migrates the slot the server
-- refuses the queue's PEXPIRE (a key that may not be local), and it is skipped
-- (redis.pcall).
local function extend(key, token, ms, queue)
    if redis.call('GET', key) == token then
        redis.pcall('PEXPIRE', queue, tonumber(ms) + QUEUE_SLACK_MS)
        return redis.call('PEXPIRE', key, ms)
    end
    return 0
end
