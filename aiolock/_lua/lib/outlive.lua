-- outlive(key, ms): a sorted set or hash of holders (a semaphore's, a read-write
-- lock's) lives as long as its longest lease: a lease set to end at `now + ms` keeps
-- the key at least that long. (Its expiry is only its clean-up: each holder's own end
-- is in its member.)
local function outlive(key, ms)
    local left = redis.call('PTTL', key)
    if left >= 0 and left < tonumber(ms) then
        redis.call('PEXPIRE', key, ms)
    end
end
