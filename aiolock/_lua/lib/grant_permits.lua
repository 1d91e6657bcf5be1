--@include permits
--@include tell
--@include take
-- grant_free(limit, now, channel, sharded): the grant rule: while a permit is free,
-- grant it to the first live waiter. Returns how many it granted.
local function grant_free(limit, now, channel, sharded)
    local granted = 0
    while redis.call('ZCARD', KEYS[1]) < limit do
        local heir = redis.call('LPOP', KEYS[2])
        if not heir then
            break
        end
        local ms, _, written, tag = take_entry(heir)
        if ms then
            give(heir, now, ms)
            tell(channel, sharded, heir, ms, 0, written, tag)
            granted = granted + 1
        end
    end
    return granted
end
