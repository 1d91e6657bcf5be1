--@include fence
--@include tell
--@include take
-- The grant rule every lock script that frees the lock follows: KEYS[1] the lock,
-- KEYS[2] the queue, KEYS[3] the fencing counter.

-- grant_next(channel, sharded): hand the lock to the first live waiter of the queue
-- (dead ones are dropped on the way): the key takes its token with the lease its entry
-- asks for, the queue lives that long plus its slack, and the waiter is told. Returns
-- that lease (ms), or false with nobody alive queued.
local function grant_next(channel, sharded)
    while true do
        local heir = redis.call('LPOP', KEYS[2])
        if not heir then
            return false
        end
        local ms, fenced, written, tag = take_entry(heir)
        if ms then
            redis.call('SET', KEYS[1], heir, 'PX', ms)
            redis.call('PEXPIRE', KEYS[2], tonumber(ms) + QUEUE_SLACK_MS)
            local fence = 0
            if fenced == 'f' then
                fence = next_fence(KEYS[3])
            end
            tell(channel, sharded, heir, ms, fence, written, tag)
            return tonumber(ms)
        end
    end
end
