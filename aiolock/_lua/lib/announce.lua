-- Best-effort announcements. They go out with redis.pcall: a server that refuses them
-- (a user without channel rights, a server without SPUBLISH) must not turn a release
-- into an error; waiters then find their grant, or the free lock, when they check.

-- announce(channel, sharded, payload): PUBLISH (SPUBLISH when `sharded` is '1') the
-- payload; how many heard it (0 if the server refused).
local function announce(channel, sharded, payload)
    local heard
    if sharded == '1' then
        heard = redis.pcall('SPUBLISH', channel, payload)
    else
        heard = redis.pcall('PUBLISH', channel, payload)
    end
    if type(heard) == 'number' then
        return heard
    end
    return 0
end
