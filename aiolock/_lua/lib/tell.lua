-- Best-effort announcements, and how a grant is made known. The announcements go out
-- with redis.pcall: a server that refuses them (a user without channel rights, a server
-- without SPUBLISH) must not turn a release into an error; waiters then find their
-- grant, or the free lock, when they check.

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

-- tell(...): tell `heir` of its grant ('g <token> <ms> <fence> <n>'): on its process's
-- grant channel, `<channel>:<tag>`, or, if nobody listens there (or its entry names
-- none), on the lock's channel, where every waiter hears it.
local function tell(channel, sharded, heir, ms, fence, written, tag)
    local message = 'g ' .. heir .. ' ' .. ms .. ' ' .. string.format('%d', fence)
    message = message .. ' ' .. written
    if tag == '' or announce(channel .. ':' .. tag, sharded, message) == 0 then
        announce(channel, sharded, message)
    end
end
