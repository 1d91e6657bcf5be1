--@include announce
-- How a grant is made known (see lib/announce.lua for the announcements themselves).

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
