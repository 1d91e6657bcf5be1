-- A semaphore's permits. Its key, KEYS[1], is a sorted set of its holders: each
-- permit's token, scored with when its lease ends, in the server's milliseconds (TIME).
-- A permit whose lease has ended is dropped when met; the set expires with its last
-- lease, and vanishes when its last member is removed. The queue, KEYS[2], and its
-- entries are the lock's; a grant adds the heir's token to the set.

-- keep(): the set lives as long as its longest lease (call it after adding or removing
-- one).
local function keep()
    local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    if last[2] then
        redis.call('PEXPIREAT', KEYS[1], last[2])
    end
end

-- give(heir, now, ms): give `heir` a permit: its entry's first lease, from now.
local function give(heir, now, ms)
    redis.call('ZADD', KEYS[1], now + tonumber(ms), heir)
    keep()
    redis.call('PEXPIRE', KEYS[2], tonumber(ms) + QUEUE_SLACK_MS)
end
